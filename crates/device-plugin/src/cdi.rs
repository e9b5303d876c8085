//! The device plugin's CDI spec: one file in the CDI root, kind
//! `k8s.device-plugin.nvidia.com/gpu`, one device per offered GPU or MIG device named by its UUID,
//! with the same edits the DRA plugin writes for a claim (see [`node_agent::cdi`]), so a
//! container gets the same device nodes and driver mounts on either plane.
//!
//! `NVIDIA_VISIBLE_DEVICES` is not in the spec: `Allocate` sets it for the devices a container got.

use api::contract::cdi::{DEVICE_PLUGIN_KIND, DEVICE_PLUGIN_SPEC_FILE};
use node_agent::cdi::{
    self as base, Device, DriverView, Spec, SpecWriter, WriteError, device_edits, driver_edits,
};
use node_agent::devices::NodeDevice;
use std::path::PathBuf;

/// The spec of `devices`.
pub fn spec(devices: &[&NodeDevice], driver: &DriverView) -> Spec {
    let cdi_devices = devices
        .iter()
        .map(|d| Device {
            name: d.uuid.clone(),
            container_edits: device_edits(d, driver),
        })
        .collect();
    base::spec(
        DEVICE_PLUGIN_KIND.to_owned(),
        cdi_devices,
        driver_edits(driver),
    )
}

/// Writes the spec of `devices` into the writer's CDI root (atomically; a spec only matters within
/// this boot and is written again at every start) and returns its path. Refuses, naming what is
/// missing, when a device's node or a required driver file is not there.
pub fn write(writer: &SpecWriter, devices: &[&NodeDevice]) -> Result<PathBuf, WriteError> {
    let driver = writer.driver_view(devices)?;
    Ok(writer.write_spec(DEVICE_PLUGIN_SPEC_FILE, &spec(devices, &driver))?)
}
