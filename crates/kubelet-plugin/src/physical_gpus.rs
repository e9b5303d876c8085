//! The node's `PhysicalGPU` objects on the DRA plane: what NVML read at start, each GPU's health,
//! whether the kubelet took the registration, and the claims prepared on each GPU, written by
//! [`physical_gpu_objects::Publisher`] once per change.

use std::collections::BTreeMap;
use std::sync::Arc;

use gpu_discovery::Gpu;
use physical_gpu_objects::{Observed, Plane, Publisher};
use tokio::sync::watch;

use crate::device_health::HealthView;
use crate::devices::DeviceTable;
use crate::driver::{ClaimSource, Driver};
use crate::registration::RegistrationState;

/// Field manager of the plugin's PhysicalGPU writes.
const FIELD_MANAGER: &str = "gpu-kubelet-plugin";

/// What the plugin observes now.
fn observe<C: ClaimSource>(
    node: &str,
    gpus: &[Gpu],
    table: &DeviceTable,
    health: &HealthView,
    registered: &RegistrationState,
    driver: &Driver<C>,
) -> Observed {
    let (major, minor) = table.cuda_driver_version;
    Observed {
        node: node.to_owned(),
        node_uid: String::new(),
        plane: Plane::Dra,
        driver_version: table.driver_version.clone(),
        cuda_driver_version: format!("{major}.{minor}"),
        gpus: gpus.to_vec(),
        faults: health
            .faults
            .iter()
            .map(|(uuid, f)| (uuid.clone(), f.fault.to_string()))
            .collect::<BTreeMap<_, _>>(),
        health_unknown: health.unknown,
        offered: *registered == RegistrationState::Registered,
        consumers: driver.consumers(),
        stopped: false,
    }
}

/// Keeps the node's PhysicalGPUs following the plugin until `stop` (or the health view goes);
/// then writes that nothing serves them (within [`physical_gpu_objects::FINAL_WRITE`]).
pub async fn follow<C: ClaimSource + Send + Sync + 'static>(
    client: kube::Client,
    node: String,
    gpus: Vec<Gpu>,
    driver: Arc<Driver<C>>,
    (mut health, mut registered): (
        watch::Receiver<HealthView>,
        watch::Receiver<RegistrationState>,
    ),
    stop: impl std::future::Future<Output = ()>,
) {
    let mut claims = driver.claim_changes();
    let table = driver.devices().clone();
    let now = |health: &HealthView, registered: &RegistrationState| {
        observe(&node, &gpus, &table, health, registered, &driver)
    };
    let first = now(&health.borrow_and_update(), &registered.borrow_and_update());
    let (observed, follower) = watch::channel(first);
    let writer = tokio::spawn(Publisher::run(client, follower, FIELD_MANAGER));
    let mut stop = std::pin::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => break,
            changed = health.changed() => if changed.is_err() { break },
            changed = registered.changed() => if changed.is_err() { break },
            changed = claims.changed() => if changed.is_err() { break },
        }
        let next = now(&health.borrow_and_update(), &registered.borrow_and_update());
        observed.send_if_modified(|o| {
            let changed = *o != next;
            *o = next;
            changed
        });
    }
    physical_gpu_objects::stop_serving(observed, writer).await;
}
