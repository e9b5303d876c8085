//! The node's `PhysicalGPU` objects on the DRA plane: what NVML read at start, each GPU's health,
//! whether the kubelet took the registration, and the claims prepared on each GPU, written by
//! [`inventory::Publisher`] once per change.

use std::collections::BTreeMap;
use std::sync::Arc;

use gpu_discovery::Gpu;
use inventory::{Observed, Plane, Publisher};
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
    }
}

/// Keeps the node's PhysicalGPUs following the plugin until the health view goes.
pub async fn follow<C: ClaimSource + Send + Sync + 'static>(
    client: kube::Client,
    node: String,
    gpus: Vec<Gpu>,
    driver: Arc<Driver<C>>,
    mut health: watch::Receiver<HealthView>,
    mut registered: watch::Receiver<RegistrationState>,
) {
    let mut claims = driver.claim_changes();
    let table = driver.devices().clone();
    let now = |health: &HealthView, registered: &RegistrationState| {
        observe(&node, &gpus, &table, health, registered, &driver)
    };
    let first = now(&health.borrow_and_update(), &registered.borrow_and_update());
    let (observed, follower) = watch::channel(first);
    tokio::spawn(Publisher::run(client, follower, FIELD_MANAGER));
    loop {
        tokio::select! {
            changed = health.changed() => if changed.is_err() { return },
            changed = registered.changed() => if changed.is_err() { return },
            changed = claims.changed() => if changed.is_err() { return },
        }
        let next = now(&health.borrow_and_update(), &registered.borrow_and_update());
        observed.send_if_modified(|o| {
            let changed = *o != next;
            *o = next;
            changed
        });
    }
}
