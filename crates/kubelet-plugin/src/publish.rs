//! Keeps the node's ResourceSlices in the API equal to [`crate::slices::desired_slices`]:
//! publishes at start, then re-checks on every slice event, every change of device health and
//! periodically, so slices the kubelet wiped (plugin gone for 30 s, kubelet restart) are
//! published again. The slices are read from a watch-fed store, never listed per event, so the
//! echo of the plugin's own writes costs no request.
//!
//! Unhealthy devices are published with taints (see [`crate::device_health`]). An apiserver
//! without device taints (`DRADeviceTaints` off) drops them from what it stores; the publisher
//! sees that in the write's answer and from then on leaves unhealthy devices out of the slices
//! instead.
//!
//! GPU shares and dynamic MIG's partitions go the same way where the apiserver drops what they
//! need (`DRAConsumableCapacity` or `DRAPartitionableDevices` off) or refuses their layout:
//! Kubernetes 1.34 wants a device's counter set in the device's own slice and answers the 1.35
//! layout (counter sets in slices of their own) with 422. Either way the node's GPUs are
//! published whole, unshared and unpartitioned.

use crate::device_health::{self, HealthView};
use crate::devices::DeviceTable;
use crate::devices::Share;
use crate::sharing;
use crate::slices::{self, NodeRef, Taints};
use api::gpuclass::variants::SharedOffer;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

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
    health: watch::Receiver<HealthView>,
    /// The GPU classes' shared offers (see [`crate::sharing`]).
    offers: watch::Receiver<Vec<SharedOffer>>,
    /// The devices prepared claims hold, by name (see [`Publisher::with_held`]).
    held: Option<watch::Receiver<BTreeSet<String>>>,
    /// The shares of the last publish (at start: those the live slices hold).
    published_shares: Vec<Share>,
    /// Whether `published_shares` was read from the live slices yet.
    shares_seeded: bool,
    /// Whether the apiserver keeps device taints; until it is seen dropping them, it does.
    taints_kept: bool,
    /// Whether the apiserver keeps multi-allocatable devices and counters; until it is seen
    /// dropping them, it does.
    sharing_kept: bool,
    last_generation: i64,
    /// Slices written by the last publish that the watch has not shown since, by name (with the
    /// resourceVersion the write returned).
    awaiting: BTreeMap<String, Option<String>>,
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
    /// A publisher for `node_name`'s slices, following `health` and the classes' `offers`,
    /// reading the Node's UID for the owner reference.
    pub async fn new(
        client: Client,
        driver: &str,
        node_name: &str,
        table: Arc<DeviceTable>,
        health: watch::Receiver<HealthView>,
        offers: watch::Receiver<Vec<SharedOffer>>,
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
            health,
            offers,
            held: None,
            published_shares: Vec::new(),
            shares_seeded: false,
            taints_kept: true,
            sharing_kept: true,
            last_generation: 0,
            awaiting: BTreeMap::new(),
        })
    }

    /// Keeps publishing a share that `held` (the devices prepared claims hold) names after the
    /// offers stop making it, until no claim holds it ([`sharing::keep_held`]).
    pub fn with_held(mut self, held: watch::Receiver<BTreeSet<String>>) -> Self {
        self.held = Some(held);
        self
    }

    /// The slices to publish now, with `generation`: unhealthy devices tainted, or left out
    /// where the apiserver drops taints; shares of the GPUs the classes offer, unless the
    /// apiserver drops what sharing needs.
    fn desired(&self, generation: i64) -> Vec<ResourceSlice> {
        self.desired_with_shares(generation).0
    }

    /// [`Publisher::desired`], with the shares in it.
    fn desired_with_shares(&self, generation: i64) -> (Vec<ResourceSlice>, Vec<Share>) {
        let view = self.health.borrow();
        // Without counters, partitions would be handed out overlapping: GPUs go whole.
        let mut table = if self.sharing_kept {
            std::borrow::Cow::Borrowed(&*self.table)
        } else {
            std::borrow::Cow::Owned(self.table.without_partitions())
        };
        let mut taints = device_health::device_taints(&table, &view);
        if !self.taints_kept && !taints.is_empty() {
            table
                .to_mut()
                .devices
                .retain(|name, _| !taints.contains_key(name));
            taints = Taints::new();
        }
        let shares = if self.sharing_kept {
            let offered = sharing::shares(&table, &self.offers.borrow());
            match &self.held {
                Some(held) => sharing::keep_held(offered, &self.published_shares, &held.borrow()),
                None => offered,
            }
        } else {
            Vec::new()
        };
        let slices = slices::desired_slices(
            &self.node,
            &self.driver,
            &table,
            &shares,
            &taints,
            generation,
        );
        (slices, shares)
    }

    fn field_selector(&self) -> String {
        format!(
            "spec.nodeName={},spec.driver={}",
            self.node.name, self.driver
        )
    }

    /// Compares `existing` (the node's slices as the watch last saw them) with the desired
    /// slices and writes what differs. Until the watch has shown every slice written here (see
    /// [`Publisher::saw`]), the store is behind, not different, and nothing is written.
    pub async fn reconcile(
        &mut self,
        existing: &[Arc<ResourceSlice>],
    ) -> Result<Outcome, kube::Error> {
        if !self.awaiting.is_empty() {
            return Ok(Outcome::Unchanged);
        }
        let api: Api<ResourceSlice> = Api::all(self.client.clone());
        let existing: Vec<ResourceSlice> = existing.iter().map(|s| (**s).clone()).collect();
        if !self.shares_seeded {
            // A restarted plugin keeps the shares it published before while claims hold them.
            self.published_shares = existing
                .iter()
                .flat_map(|s| s.spec.devices.iter().flatten())
                .filter_map(sharing::published_share)
                .collect();
            self.shares_seeded = true;
        }
        let current = existing
            .iter()
            .map(|s| s.spec.pool.generation)
            .max()
            .unwrap_or(self.last_generation);
        let probe = self.desired(current);
        if slices::up_to_date(&existing, &probe) {
            self.last_generation = current;
            return Ok(Outcome::Unchanged);
        }
        let mut generation = slices::next_generation(&existing, self.last_generation);
        let (mut desired, mut shares) = self.desired_with_shares(generation);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let mut index = 0;
        while let Some(slice) = desired.get(index) {
            let name = slice.metadata.name.clone().unwrap_or_default();
            let written = match api.patch(&name, &params, &Patch::Apply(slice)).await {
                Err(kube::Error::Api(status))
                    if self.sharing_kept && refuses_sharing(slice, &status) =>
                {
                    tracing::warn!(node = %self.node.name, answer = %status.message, "the apiserver refuses shared devices in this layout (Kubernetes 1.34 does): no GPU is published in shares");
                    self.sharing_kept = false;
                    generation += 1;
                    (desired, shares) = self.desired_with_shares(generation);
                    self.awaiting.clear();
                    index = 0;
                    continue;
                }
                other => other?,
            };
            let drops_taints = self.taints_kept && taints_dropped(slice, &written);
            if drops_taints {
                tracing::warn!(node = %self.node.name, "the apiserver drops device taints (DRADeviceTaints is off): unhealthy devices are left out of the slices instead");
                self.taints_kept = false;
            }
            let drops_sharing = self.sharing_kept && sharing_dropped(slice, &written);
            if drops_sharing {
                tracing::warn!(node = %self.node.name, "the apiserver drops shared devices or counters (DRAConsumableCapacity or DRAPartitionableDevices is off): no GPU is published in shares");
                self.sharing_kept = false;
            }
            if drops_taints || drops_sharing {
                generation += 1;
                (desired, shares) = self.desired_with_shares(generation);
                self.awaiting.clear();
                index = 0;
                continue;
            }
            self.awaiting
                .insert(name, written.metadata.resource_version);
            index += 1;
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
        self.published_shares = shares;
        Ok(Outcome::Published(generation))
    }

    /// Takes in a watch event: a slice written here that the watch shows again (its echo, a
    /// later change, or its deletion) is no longer awaited.
    pub fn saw(&mut self, event: &watcher::Event<ResourceSlice>) {
        match event {
            watcher::Event::Apply(s) | watcher::Event::InitApply(s) | watcher::Event::Delete(s) => {
                if let Some(name) = &s.metadata.name {
                    self.awaiting.remove(name);
                }
            }
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
    }

    /// Reconciles once the store holds the first full list, then on every event about this
    /// node's slices and every [`RESYNC`], forever; failures are logged and retried after
    /// [`RETRY`].
    pub async fn run(mut self) {
        let api: Api<ResourceSlice> = Api::all(self.client.clone());
        let config = watcher::Config::default().fields(&self.field_selector());
        let (store, writer) = reflector::store();
        let mut events = watcher(api, config)
            .default_backoff()
            .reflect(writer)
            .boxed();
        // The first check is a full period away: an immediate tick would clear the slices awaited
        // from the first publish before their echo, and publish again.
        let mut resync = tokio::time::interval_at(tokio::time::Instant::now() + RESYNC, RESYNC);
        // The store fills from the watch: drive it until the first list is in (an empty list
        // included: the list's end is an event too).
        while store.wait_until_ready().now_or_never().is_none() {
            if events.next().await.is_none() {
                return;
            }
        }
        let mut health_followed = true;
        let mut offers_followed = true;
        let mut held_followed = self.held.is_some();
        loop {
            match self.reconcile(&slices_in(&store)).await {
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
            // Wait for a change the store has taken in whole: a relist is compared once it
            // ends, not object by object.
            loop {
                tokio::select! {
                    event = events.next() => match event {
                        Some(Ok(event)) => {
                            self.saw(&event);
                            if matches!(event, watcher::Event::Init | watcher::Event::InitApply(_)) {
                                continue;
                            }
                        }
                        Some(Err(e)) => tracing::debug!(error = %e, "ResourceSlice watch error"),
                        None => tokio::time::sleep(RETRY).await,
                    },
                    // Whatever the watch showed, the periodic check compares afresh.
                    _ = resync.tick() => self.awaiting.clear(),
                    changed = self.health.changed(), if health_followed => {
                        // The health tracker ended (only at shutdown): nothing more to follow.
                        health_followed = changed.is_ok();
                    }
                    changed = self.offers.changed(), if offers_followed => {
                        offers_followed = changed.is_ok();
                    }
                    changed = held_changed(self.held.as_mut()), if held_followed => {
                        held_followed = changed;
                    }
                }
                break;
            }
        }
    }
}

/// Waits for the held devices to change; false once their sender is gone (or there is none).
async fn held_changed(held: Option<&mut watch::Receiver<BTreeSet<String>>>) -> bool {
    match held {
        Some(held) => held.changed().await.is_ok(),
        None => false,
    }
}

/// Whether `sent` had device taints that `written` (what the apiserver stored) lacks.
fn taints_dropped(sent: &ResourceSlice, written: &ResourceSlice) -> bool {
    let tainted = |s: &ResourceSlice| {
        s.spec
            .devices
            .iter()
            .flatten()
            .filter(|d| d.taints.as_ref().is_some_and(|t| !t.is_empty()))
            .count()
    };
    tainted(sent) > 0 && tainted(written) == 0
}

/// Whether `sent` had multi-allocatable devices or counter sets that `written` (what the
/// apiserver stored) lacks.
fn sharing_dropped(sent: &ResourceSlice, written: &ResourceSlice) -> bool {
    (shared_devices(sent) && !shared_devices(written))
        || (counter_sets(sent) && !counter_sets(written))
}

/// Whether a device of `slice` may be allocated many times or draws on counters.
fn shared_devices(slice: &ResourceSlice) -> bool {
    slice
        .spec
        .devices
        .iter()
        .flatten()
        .any(|d| d.allow_multiple_allocations == Some(true) || d.consumes_counters.is_some())
}

/// Whether `slice` carries counter sets.
fn counter_sets(slice: &ResourceSlice) -> bool {
    slice
        .spec
        .shared_counters
        .as_ref()
        .is_some_and(|c| !c.is_empty())
}

/// Whether the apiserver's answer to writing `sent` refuses the slice for its shares: a 422 about
/// counters on a slice that carries counter consumption or counter sets.
fn refuses_sharing(sent: &ResourceSlice, answer: &kube::core::Status) -> bool {
    (shared_devices(sent) || counter_sets(sent))
        && answer.code == 422
        && answer.message.to_ascii_lowercase().contains("counter")
}

fn slices_in(store: &Store<ResourceSlice>) -> Vec<Arc<ResourceSlice>> {
    store.state()
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use http::StatusCode;
    use service::fake_api::{client, reply};

    use super::*;
    use crate::testutil::table;

    /// A publisher whose API answers every write with the written object and logs it.
    fn publisher() -> (Publisher, Writes) {
        let (publisher, writes, _) = publisher_on(true);
        (publisher, writes)
    }

    /// The writes a fake API saw, as `METHOD path`, ` tainted` when a device had taints.
    type Writes = Arc<Mutex<Vec<String>>>;

    /// A publisher whose API keeps device taints or drops them, with the sender of its health.
    fn publisher_on(keeps_taints: bool) -> (Publisher, Writes, watch::Sender<HealthView>) {
        let (publisher, writes, health, _) = publisher_with(keeps_taints, ApiSharing::Keeps);
        (publisher, writes, health)
    }

    /// What the fake API does with shared devices and counter sets.
    #[derive(Clone, Copy, PartialEq)]
    enum ApiSharing {
        Keeps,
        /// Drops them from what it stores (their gates off).
        Drops,
        /// Answers a slice that consumes counters with 1.34's 422.
        Refuses,
    }

    /// A publisher whose API keeps or drops device taints and treats shared devices as told,
    /// with the senders of its health and of the classes' offers.
    fn publisher_with(
        keeps_taints: bool,
        sharing: ApiSharing,
    ) -> (
        Publisher,
        Writes,
        watch::Sender<HealthView>,
        watch::Sender<Vec<SharedOffer>>,
    ) {
        let writes = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&writes);
        let client = client("default", move |method, path, body| {
            let mut object: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
            let tainted = object.pointer("/spec/devices").is_some_and(|d| {
                d.as_array()
                    .into_iter()
                    .flatten()
                    .any(|d| d.get("taints").is_some())
            });
            log.lock().unwrap().push(format!(
                "{method} {path}{}",
                if tainted { " tainted" } else { "" }
            ));
            if !keeps_taints {
                for device in object
                    .pointer_mut("/spec/devices")
                    .and_then(|d| d.as_array_mut())
                    .into_iter()
                    .flatten()
                {
                    device.as_object_mut().unwrap().remove("taints");
                }
            }
            let consumes = object.pointer("/spec/devices").is_some_and(|d| {
                d.as_array()
                    .into_iter()
                    .flatten()
                    .any(|d| d.get("consumesCounters").is_some())
            });
            if sharing == ApiSharing::Refuses && consumes {
                let message = "ResourceSlice.resource.k8s.io \"x\" is invalid: spec.devices[0].consumesCounters[0].counterSet: Invalid value: \"gpu-0\": must reference a counterSet defined in the ResourceSlice sharedCounters";
                return reply(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    &serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "message": message, "reason": "Invalid", "code": 422}),
                );
            }
            if sharing == ApiSharing::Drops {
                object["spec"]
                    .as_object_mut()
                    .map(|s| s.remove("sharedCounters"));
                for device in object
                    .pointer_mut("/spec/devices")
                    .and_then(|d| d.as_array_mut())
                    .into_iter()
                    .flatten()
                {
                    let device = device.as_object_mut().unwrap();
                    device.remove("allowMultipleAllocations");
                    device.remove("consumesCounters");
                }
            }
            reply(StatusCode::OK, &object)
        });
        let (health_tx, health) = watch::channel(HealthView::default());
        let (offers_tx, offers) = watch::channel(Vec::new());
        let publisher = Publisher {
            client,
            driver: "gpu.nvidia.com".into(),
            node: NodeRef {
                name: "gpu-node-0".into(),
                uid: "u".into(),
            },
            table: Arc::new(table(2)),
            health,
            offers,
            held: None,
            published_shares: Vec::new(),
            shares_seeded: false,
            taints_kept: true,
            sharing_kept: true,
            last_generation: 0,
            awaiting: BTreeMap::new(),
        };
        (publisher, writes, health_tx, offers_tx)
    }

    fn quarters() -> Vec<SharedOffer> {
        let class: api::GPUClass = serde_json::from_value(serde_json::json!({
            "apiVersion": "gpu-operator-rs.dev/v1alpha1",
            "kind": "GPUClass",
            "metadata": {"name": "a100"},
            "spec": {"selector": {"productNames": ["NVIDIA A100-SXM4-40GB"]},
                     "variants": {"shared": {"shares": 4}}},
        }))
        .unwrap();
        sharing::offers([&class])
    }

    #[tokio::test]
    async fn a_class_offering_shares_republishes_the_pool_with_them() {
        let (mut p, _writes, _health, offers) = publisher_with(true, ApiSharing::Keeps);
        assert_eq!(p.reconcile(&[]).await.unwrap(), Outcome::Published(1));
        let first = p.desired(1);
        p.awaiting.clear();
        offers.send_replace(quarters());
        assert_eq!(
            p.reconcile(&seen(first)).await.unwrap(),
            Outcome::Published(2)
        );
        let shared = p.desired(2);
        assert_eq!(
            device_names(&shared),
            ["gpu-0", "gpu-0-shared-a100", "gpu-1", "gpu-1-shared-a100"]
        );
        p.awaiting.clear();
        assert_eq!(
            p.reconcile(&seen(shared)).await.unwrap(),
            Outcome::Unchanged
        );
    }

    /// A class's `shared` variant removed (or its selector narrowed) while a claim holds a share:
    /// the share and the counter it draws on stay published until the claim is unprepared, so
    /// the scheduler cannot give the card whole meanwhile.
    #[tokio::test]
    async fn a_share_a_claim_holds_stays_published_until_it_is_unprepared() {
        let (mut p, _writes, _health, offers) = publisher_with(true, ApiSharing::Keeps);
        let (held, held_rx) = watch::channel(std::collections::BTreeSet::new());
        p = p.with_held(held_rx);
        offers.send_replace(quarters());
        assert_eq!(p.reconcile(&[]).await.unwrap(), Outcome::Published(1));
        let shared = p.desired(1);
        p.awaiting.clear();
        held.send_replace(["gpu-1-shared-a100".to_owned(), "gpu-0".to_owned()].into());
        offers.send_replace(Vec::new());
        assert_eq!(
            p.reconcile(&seen(shared)).await.unwrap(),
            Outcome::Published(2)
        );
        let kept = p.desired(2);
        assert_eq!(device_names(&kept), ["gpu-0", "gpu-1", "gpu-1-shared-a100"]);
        let counters: Vec<_> = kept
            .iter()
            .flat_map(|s| s.spec.shared_counters.iter().flatten())
            .map(|c| c.name.clone())
            .collect();
        assert!(
            !counters.is_empty(),
            "gpu-1's counter set stays with its share"
        );
        p.awaiting.clear();
        held.send_replace(["gpu-0".to_owned()].into());
        assert_eq!(
            p.reconcile(&seen(kept)).await.unwrap(),
            Outcome::Published(3)
        );
        assert_eq!(device_names(&p.desired(3)), ["gpu-0", "gpu-1"]);
    }

    /// The same after a plugin restart: the new plugin reads the shares it published from the
    /// live slices and keeps those claims hold.
    #[tokio::test]
    async fn a_restarted_plugin_keeps_the_held_shares_the_live_slices_show() {
        let (before, _writes, _health, offers) = publisher_with(true, ApiSharing::Keeps);
        offers.send_replace(quarters());
        let live = before.desired(4);
        let (mut p, _writes, _health, _offers) = publisher_with(true, ApiSharing::Keeps);
        let (_held, held_rx) = watch::channel(["gpu-0-shared-a100".to_owned()].into());
        p = p.with_held(held_rx);
        assert_eq!(
            p.reconcile(&seen(live)).await.unwrap(),
            Outcome::Published(5)
        );
        assert_eq!(
            device_names(&p.desired(5)),
            ["gpu-0", "gpu-0-shared-a100", "gpu-1"]
        );
    }

    #[tokio::test]
    async fn an_apiserver_without_sharing_gets_the_gpus_unshared() {
        let (mut p, _writes, _health, offers) = publisher_with(true, ApiSharing::Drops);
        offers.send_replace(quarters());
        assert!(matches!(
            p.reconcile(&[]).await.unwrap(),
            Outcome::Published(_)
        ));
        assert!(!p.sharing_kept);
        assert_eq!(device_names(&p.desired(9)), ["gpu-0", "gpu-1"]);
        assert!(
            p.desired(9)
                .iter()
                .all(|s| s.spec.shared_counters.is_none())
        );
    }

    #[tokio::test]
    async fn an_apiserver_refusing_the_counter_layout_gets_the_gpus_unshared() {
        let (mut p, writes, _health, offers) = publisher_with(true, ApiSharing::Refuses);
        offers.send_replace(quarters());
        assert!(matches!(
            p.reconcile(&[]).await.unwrap(),
            Outcome::Published(_)
        ));
        assert!(!p.sharing_kept);
        let published = p.desired(9);
        assert_eq!(device_names(&published), ["gpu-0", "gpu-1"]);
        assert!(published.iter().all(|s| s.spec.shared_counters.is_none()));
        // The refused write, then the unshared pool.
        let writes = writes.lock().unwrap().clone();
        assert_eq!(writes.len(), 2, "{writes:?}");
    }

    fn lost(gpu: &str) -> HealthView {
        HealthView {
            faults: BTreeMap::from([(
                gpu.to_owned(),
                device_health::GpuFault {
                    fault: gpu_discovery::health::Fault::Xid(Some(79)),
                    since: jiff::Timestamp::from_second(1_700_000_000).unwrap(),
                },
            )]),
            unknown: false,
        }
    }

    fn device_names(slices: &[ResourceSlice]) -> Vec<String> {
        slices
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .map(|d| d.name.clone())
            .collect()
    }

    #[tokio::test]
    async fn an_unhealthy_gpu_is_published_tainted_then_untainted() {
        let (mut p, writes, health) = publisher_on(true);
        assert_eq!(p.reconcile(&[]).await.unwrap(), Outcome::Published(1));
        let first = p.desired(1);
        p.awaiting.clear();
        health.send_replace(lost("GPU-1"));
        assert_eq!(
            p.reconcile(&seen(first)).await.unwrap(),
            Outcome::Published(2)
        );
        let tainted = p.desired(2);
        assert!(writes.lock().unwrap().last().unwrap().ends_with(" tainted"));
        assert_eq!(device_names(&tainted), ["gpu-0", "gpu-1"]);
        p.awaiting.clear();
        // Nothing changed: nothing written.
        assert_eq!(
            p.reconcile(&seen(tainted.clone())).await.unwrap(),
            Outcome::Unchanged
        );
        health.send_replace(HealthView::default());
        assert_eq!(
            p.reconcile(&seen(tainted)).await.unwrap(),
            Outcome::Published(3)
        );
        assert!(!writes.lock().unwrap().last().unwrap().ends_with(" tainted"));
    }

    #[tokio::test]
    async fn without_device_taints_an_unhealthy_gpu_is_left_out() {
        let (mut p, writes, health) = publisher_on(false);
        health.send_replace(lost("GPU-1"));
        assert_eq!(p.reconcile(&[]).await.unwrap(), Outcome::Published(2));
        assert!(!p.taints_kept);
        assert_eq!(device_names(&p.desired(2)), ["gpu-0"]);
        let writes = writes.lock().unwrap();
        assert_eq!(writes.len(), 2, "{writes:?}");
        assert!(!writes[1].ends_with(" tainted"), "{writes:?}");
    }

    fn seen(slices: Vec<ResourceSlice>) -> Vec<Arc<ResourceSlice>> {
        slices.into_iter().map(Arc::new).collect()
    }

    #[tokio::test]
    async fn nothing_is_written_until_the_watch_shows_the_last_write() {
        let (mut p, writes) = publisher();
        assert_eq!(p.reconcile(&[]).await.unwrap(), Outcome::Published(1));
        assert!(!writes.lock().unwrap().is_empty(), "nothing published");
        writes.lock().unwrap().clear();

        // The store has not caught up (it still shows nothing): behind, not different.
        assert_eq!(p.reconcile(&[]).await.unwrap(), Outcome::Unchanged);
        // The write's echo arrives: the store equals what was written.
        let echo = p.desired(1);
        for slice in &echo {
            p.saw(&watcher::Event::Apply(slice.clone()));
        }
        assert_eq!(
            p.reconcile(&seen(echo.clone())).await.unwrap(),
            Outcome::Unchanged
        );
        assert_eq!(*writes.lock().unwrap(), Vec::<String>::new());

        // The kubelet wipes the slices: published again, with the next generation.
        for slice in &echo {
            p.saw(&watcher::Event::Delete(slice.clone()));
        }
        assert_eq!(p.reconcile(&[]).await.unwrap(), Outcome::Published(2));
    }
}
