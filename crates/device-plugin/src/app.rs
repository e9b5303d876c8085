//! The running plugin: reads the GPUs, writes the CDI spec, serves one socket per resource and
//! keeps device health current from NVML.

use crate::config::{Config, Offer};
use crate::metrics::Metrics;
use crate::plan::{self, Plan};
use crate::proto;
use crate::serve::{self, Endpoint};
use crate::state::State;
use anyhow::Context;
use gpu_discovery::DriverPaths;
use gpu_discovery::health::{Change, Tracker};
use gpu_discovery::{InitMode, NvmlSession, root};
use node_agent::cdi::SpecWriter;
use node_agent::gpu_health::{self, Following, HealthSink, Wording};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::watch;

/// Sets the device gauges from `state`.
fn count(metrics: &Metrics, state: &State) {
    for name in state.plan.resources.keys() {
        let devices = state.devices(name);
        let healthy = devices
            .iter()
            .filter(|d| d.health == proto::HEALTHY)
            .count();
        metrics.set_devices(name, proto::HEALTHY, healthy);
        metrics.set_devices(name, proto::UNHEALTHY, devices.len() - healthy);
    }
}

/// The device-plugin plane's answer to GPU health changes: the devices of unhealthy GPUs are
/// listed `Unhealthy` to the kubelet (through `state`), and the device gauges follow.
struct DevicePluginHealth {
    state: watch::Sender<State>,
    metrics: Metrics,
}

impl HealthSink for DevicePluginHealth {
    async fn changed(&mut self, tracker: &Tracker, _changes: &[Change]) {
        self.state.send_modify(|s| {
            s.unhealthy = s
                .plan
                .devices
                .values()
                .map(|d| d.gpu.gpu_uuid.clone())
                .filter(|gpu| !tracker.is_healthy(gpu))
                .collect();
            s.faults = tracker
                .faults()
                .map(|(gpu, fault)| (gpu.to_owned(), fault.to_string()))
                .collect();
            s.nvml_failing = tracker.nvml_failing();
        });
        count(&self.metrics, &self.state.borrow());
    }
}

/// What NVML read at start: the plan, GPU UUIDs by NVML index, the library read, and the GPUs
/// with the driver's versions.
struct Read {
    plan: Plan,
    by_index: BTreeMap<u32, String>,
    library: std::path::PathBuf,
    inventory: gpu_discovery::Inventory,
}

/// Reads the GPUs and decides the plan.
fn read_plan(offer: &Offer, roots: &DriverPaths) -> anyhow::Result<Read> {
    let library = root::find_library(&roots.driver_root_ctr, "container driver root")
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let session = NvmlSession::open(&library, InitMode::Full)?;
    let inventory = session.inventory()?;
    for gpu in &inventory.unreadable {
        tracing::error!(gpu = gpu.index, lost = gpu.lost, error = %gpu.error, "GPU left out: NVML could not read it");
    }
    let plan = plan::plan(&inventory, offer);
    for problem in &plan.problems {
        tracing::warn!("{problem}");
    }
    let by_index = inventory
        .gpus
        .iter()
        .map(|g| (g.index, g.uuid.clone()))
        .collect();
    Ok(Read {
        plan,
        by_index,
        library,
        inventory,
    })
}

/// Runs the plugin until SIGTERM/SIGINT.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let shutdown = service::shutdown::Shutdown::on_signal();
    let roots = config.node.driver_paths();
    tracing::info!(node = %config.node_name, "starting");
    let offer = config.offer()?;
    let Read {
        plan,
        by_index: gpus_by_index,
        library,
        inventory,
    } = read_plan(&offer, &roots).context("reading the GPUs through NVML")?;
    let writer =
        SpecWriter::new(&config.node.cdi_root, &roots).with_procfs_root(&config.node.procfs_root);
    let devices: Vec<_> = plan.devices.values().collect();
    if !devices.is_empty() {
        let spec = crate::cdi::write(&writer, &devices).context("writing the CDI spec")?;
        tracing::info!(spec = %spec.display(), devices = devices.len(), "CDI spec written");
    }
    for (name, r) in &plan.resources {
        tracing::info!(resource = %name, devices = r.devices.len(), "offering");
    }

    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::register(&mut registry);
    let resources: Vec<_> = plan.resources.values().cloned().collect();
    let (state_tx, state_rx) = watch::channel(State {
        plan: Arc::new(plan),
        ..State::default()
    });
    count(&metrics, &state_rx.borrow());

    let Following {
        monitor,
        task: health,
    } = gpu_health::follow(
        library,
        gpus_by_index,
        &config.node,
        Wording {
            unhealthy: "its devices are no longer offered",
            recovered: "its devices are offered again",
            unknown: "keeping what was last known",
        },
        DevicePluginHealth {
            state: state_tx,
            metrics: metrics.clone(),
        },
    );

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let health_http = service::http::Health::default();
    let mut servers = Vec::new();
    let mut registrations = Vec::new();
    for r in &resources {
        let (registered_tx, registered_rx) = watch::channel(false);
        registrations.push(registered_rx);
        let endpoint = Endpoint {
            dir: config.device_plugin_path.clone(),
            resource: r.name.clone(),
            socket: r.socket_name(),
        };
        servers.push(tokio::spawn(serve::run(
            endpoint,
            state_rx.clone(),
            metrics.clone(),
            shutdown_rx.clone(),
            registered_tx,
        )));
    }
    let physical_gpus = tokio::spawn(crate::physical_gpus::follow(
        config.node_name.clone(),
        inventory,
        state_rx.clone(),
        registrations.clone(),
        shutdown_rx.clone(),
    ));
    let readiness = health_http.clone();
    tokio::spawn(async move {
        // Ready while the kubelet holds every resource's registration.
        loop {
            readiness.set_ready(registrations.iter().all(|r| *r.borrow()));
            tokio::time::sleep(serve::SOCKET_CHECK).await;
        }
    });
    if let Some(addr) = config.node.http_endpoint.0 {
        let mut stop = shutdown_rx.clone();
        let stopped = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        service::http::spawn(addr, registry, health_http, stopped);
    }

    // The health task ends only if the NVML monitor died: then nothing would notice a GPU fail,
    // so the plugin stops (its DaemonSet restarts it) rather than serve stale health.
    let outcome = tokio::select! {
        () = shutdown.wait() => Ok(()),
        _ = health => Err(anyhow::anyhow!("the NVML monitor stopped; device health can no longer be read")),
    };
    tracing::info!("stopping");
    let _ = shutdown_tx.send(true);
    for server in servers {
        let _ = server.await;
    }
    // The PhysicalGPUs say that nothing serves them now (bounded by physical_gpu_objects::FINAL_WRITE).
    let _ = physical_gpus.await;
    drop(monitor);
    tracing::info!("sockets removed; bye");
    outcome
}
