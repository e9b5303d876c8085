//! The node's `PhysicalGPU` objects on the device-plugin plane: what NVML read at start, each
//! GPU's health, and whether the kubelet holds every resource's registration, written by
//! [`physical_gpu_objects::Publisher`] once per change. Without API access (no token, no `NODE_NAME`) the
//! plugin serves the kubelet all the same and writes none.

use std::collections::BTreeMap;
use std::time::Duration;

use gpu_discovery::Inventory;
use physical_gpu_objects::{Observed, Plane, Publisher};
use tokio::sync::watch;

use crate::state::State;

/// Field manager of the plugin's PhysicalGPU writes.
const FIELD_MANAGER: &str = "gpu-device-plugin";
/// How often the registrations are looked at (they change when the kubelet restarts).
const REGISTRATION_CHECK: Duration = Duration::from_secs(1);

fn observe(
    node: &str,
    inventory: &Inventory,
    state: &State,
    registrations: &[watch::Receiver<bool>],
) -> Observed {
    Observed {
        node: node.to_owned(),
        node_uid: String::new(),
        plane: Plane::DevicePlugin,
        driver_version: inventory.driver_version.clone(),
        cuda_driver_version: inventory.cuda_driver_version.to_string(),
        gpus: inventory.gpus.clone(),
        faults: state.faults.clone(),
        health_unknown: state.nvml_failing,
        offered: !registrations.is_empty() && registrations.iter().all(|r| *r.borrow()),
        // The device plugin is not told which pod gets a device.
        consumers: BTreeMap::new(),
        stopped: false,
    }
}

/// Keeps the node's PhysicalGPUs following the plugin until `stop` turns true (or its state
/// goes); then writes that nothing serves them (within [`physical_gpu_objects::FINAL_WRITE`]).
pub async fn follow(
    node: String,
    inventory: Inventory,
    mut state: watch::Receiver<State>,
    registrations: Vec<watch::Receiver<bool>>,
    mut stop: watch::Receiver<bool>,
) {
    if node.is_empty() {
        tracing::warn!("NODE_NAME is not set: this node's PhysicalGPUs are not written");
        return;
    }
    let client = match service::kube_client("gpu-device-plugin").await {
        Ok(client) => client,
        Err(e) => {
            tracing::warn!(error = %e, "no API access: this node's PhysicalGPUs are not written");
            return;
        }
    };
    let first = observe(
        &node,
        &inventory,
        &state.borrow_and_update(),
        &registrations,
    );
    let (observed, follower) = watch::channel(first);
    let writer = tokio::spawn(Publisher::run(client, follower, FIELD_MANAGER));
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            changed = tokio::time::timeout(REGISTRATION_CHECK, state.changed()) => {
                if let Ok(Err(_)) = changed {
                    break;
                }
            }
        }
        let next = observe(
            &node,
            &inventory,
            &state.borrow_and_update(),
            &registrations,
        );
        observed.send_if_modified(|o| {
            let changed = *o != next;
            *o = next;
            changed
        });
    }
    physical_gpu_objects::stop_serving(observed, writer).await;
}
