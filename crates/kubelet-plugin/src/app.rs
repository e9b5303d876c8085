//! The running plugin: wires configuration, NVML, the checkpoint, the sockets, the slice
//! publisher, liveness and metrics together.

use crate::cdi::CdiWriter;
use crate::checkpoint::{self, CheckpointStore, LoadOutcome};
use crate::config::Config;
use crate::devices::DeviceTable;
use crate::driver::{Driver, KubeClaims, StartReport};
use crate::grpc::DraService;
use crate::health::HealthService;
use crate::metrics::Metrics;
use crate::publish::Publisher;
use crate::registration::{RegistrationService, RegistrationState};
use crate::server::{SocketPaths, Sockets};
use crate::sockets::private_dir;
use anyhow::Context;
use api::contract::DRIVER_NAME;
use gpu_discovery::DriverPaths;
use gpu_discovery::{DriverReady, InitMode, NvmlSession, UnreadableGpu, root};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use std::path::Path;
use std::sync::Arc;

/// Where the kernel says when this boot began (`btime`).
const PROC_STAT: &str = "/proc/stat";

/// Reads the node's devices through NVML loaded from the container driver root, with the GPUs
/// NVML could not read (left out of the table).
pub fn read_devices(roots: &DriverPaths) -> anyhow::Result<(DeviceTable, Vec<UnreadableGpu>)> {
    let library = root::find_library(&roots.driver_root_ctr, "container driver root")
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let session = NvmlSession::open(&library, InitMode::Full)?;
    let inventory = session.inventory()?;
    Ok((
        DeviceTable::from_inventory(&inventory),
        inventory.unreadable,
    ))
}

/// The Event note for a GPU left out because NVML could not read it.
pub fn unreadable_note(gpu: &UnreadableGpu) -> String {
    let what = if gpu.lost {
        "is lost"
    } else {
        "could not be read"
    };
    format!(
        "GPU {index} {what} and is not published; the node's other GPUs still are. NVML said: \
         {error}. Check the GPU (nvidia-smi -q -i {index}, the kernel log for XID errors), then \
         restart this node's gpu-kubelet-plugin pod to publish it again.",
        index = gpu.index,
        error = gpu.error,
    )
}

/// Publishes a Warning Event on `node` as the plugin.
async fn node_event(client: &kube::Client, node: &str, reason: &str, note: String) {
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "gpu-kubelet-plugin".into(),
            instance: Some(node.to_owned()),
        },
    );
    let event = Event {
        type_: EventType::Warning,
        reason: reason.into(),
        note: Some(note),
        action: "Recover".into(),
        secondary: None,
    };
    let node_ref = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.to_owned()),
        ..Default::default()
    };
    if let Err(e) = recorder.publish(&event, &node_ref).await {
        tracing::warn!(error = %e, reason, "could not publish an event on the node");
    }
}

async fn report_start(client: &kube::Client, node: &str, report: &StartReport) {
    for claim in &report.rolled_back {
        tracing::warn!(%claim, "rolled back a claim left half-prepared by a crash");
    }
    for uid in &report.stray_specs {
        tracing::warn!(claim_uid = %uid, "rolled back a claim left half-prepared by a crash: removed its CDI spec, which the checkpoint did not record");
    }
    match &report.outcome {
        LoadOutcome::Corrupted { moved_to, reason } => {
            tracing::error!(moved_to = %moved_to.display(), %reason, "checkpoint corrupted; moved aside, starting empty");
            let note = format!(
                "gpu-kubelet-plugin checkpoint was corrupted ({reason}); moved to {} and started empty",
                moved_to.display()
            );
            node_event(client, node, "CheckpointCorrupted", note).await;
        }
        LoadOutcome::NewBoot { previous } => {
            tracing::info!(%previous, "checkpoint from an earlier boot discarded");
        }
        LoadOutcome::Missing | LoadOutcome::Restored => {}
    }
    tracing::info!(restored = report.restored, "checkpoint loaded");
}

/// After a lost checkpoint, prepares again every claim the API shows in use on this node, so
/// the exclusive-use check and unprepare know about them. Failures are logged, never fatal.
async fn rebuild(client: &kube::Client, driver: &Driver<KubeClaims>, node: &str) {
    use crate::types::DraBackend;
    let api: kube::Api<k8s_openapi::api::resource::v1::ResourceClaim> =
        kube::Api::all(client.clone());
    let claims = match api.list(&Default::default()).await {
        Ok(list) => crate::claim::in_use_on_pool(&list.items, DRIVER_NAME, node),
        Err(e) => {
            tracing::warn!(error = %e, "listing ResourceClaims to rebuild the checkpoint failed");
            return;
        }
    };
    for (uid, result) in driver.prepare(claims).await {
        match result {
            Ok(devices) => {
                tracing::info!(%uid, devices = devices.len(), "claim restored into the checkpoint")
            }
            Err(e) => tracing::warn!(%uid, error = %e, "claim could not be restored"),
        }
    }
}

/// Publishes the slices forever; reading the Node is retried, never fatal, so the kubelet
/// keeps being served while the API is unreachable.
async fn publish(client: kube::Client, node: String, table: Arc<DeviceTable>) {
    loop {
        match Publisher::new(client.clone(), DRIVER_NAME, &node, Arc::clone(&table)).await {
            Ok(publisher) => return publisher.run().await,
            Err(e) => {
                tracing::warn!(%node, error = %e, "reading this Node failed; retrying");
                tokio::time::sleep(crate::publish::RETRY).await;
            }
        }
    }
}

/// Runs the plugin until SIGTERM/SIGINT.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let ready = match DriverReady::read(&config.driver_ready_file) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::info!(file = %config.driver_ready_file.display(), error = %e, "no usable driver-ready file; using the flags");
            None
        }
    };
    let roots = DriverPaths::decide(
        &config.nvidia_driver_root,
        &config.driver_root_ctr_path,
        ready.as_ref().map(|r| &r.paths),
    );
    let (table, unreadable) = read_devices(&roots).context("reading the GPUs through NVML")?;
    tracing::info!(devices = table.devices.len(), driver = %table.driver_version, "GPUs found");
    for gpu in &unreadable {
        tracing::error!(gpu = gpu.index, lost = gpu.lost, error = %gpu.error, "GPU left out: NVML could not read it");
    }

    let client = service::kube_client_multiplexed("gpu-kubelet-plugin")
        .await
        .context("building the kube client")?;
    let plugin_dir = config.plugin_dir();
    private_dir(&plugin_dir)?;
    let boot_id = CheckpointStore::read_boot_id(&config.boot_id_file)
        .with_context(|| format!("reading the boot id from {}", config.boot_id_file.display()))?;
    let mut store = CheckpointStore::new(&plugin_dir, &boot_id);
    match checkpoint::read_boot_time(Path::new(PROC_STAT)) {
        Ok(boot_time) => store = store.with_boot_time(boot_time),
        Err(e) => {
            tracing::warn!(error = %e, "reading when this boot began; an unreadable checkpoint will count as corrupted")
        }
    }

    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::register(&mut registry);
    metrics.set_unreadable_gpus(unreadable.len());
    for gpu in &unreadable {
        node_event(
            &client,
            &config.node_name,
            "GPUUnreadable",
            unreadable_note(gpu),
        )
        .await;
    }
    let table = Arc::new(table);
    let (driver, report) = Driver::start(
        DRIVER_NAME,
        &config.node_name,
        KubeClaims(client.clone()),
        (*table).clone(),
        CdiWriter::new(&config.cdi_root, &roots).with_procfs_root(&config.procfs_root),
        store,
    )
    .context("loading the checkpoint")?;
    report_start(&client, &config.node_name, &report).await;
    let driver = Arc::new(driver.with_metrics(metrics));
    if matches!(report.outcome, LoadOutcome::Corrupted { .. }) {
        rebuild(&client, &driver, &config.node_name).await;
    }

    let shutdown = service::shutdown::Shutdown::on_signal();
    let paths = SocketPaths::new(
        &config.kubelet_registrar_directory_path,
        &config.kubelet_plugins_directory_path,
    );
    let sockets = Sockets::bind(&paths)?;
    let registration = RegistrationService::new(DRIVER_NAME, &paths.dra.to_string_lossy());
    let ready = service::http::Health::default();
    let mut registered = registration.state();
    let readiness = ready.clone();
    tokio::spawn(async move {
        // /readyz follows what the kubelet last said about the registration.
        loop {
            let state = registered.borrow_and_update().clone();
            readiness.set_ready(state == RegistrationState::Registered);
            if registered.changed().await.is_err() {
                break;
            }
        }
    });

    tokio::spawn(publish(client.clone(), config.node_name.clone(), table));

    if let Some(port) = config.health_port() {
        let addr = std::net::SocketAddr::from(([0, 0, 0, 0], port));
        let health = HealthService::new(paths.clone()).into_server();
        let stop = shutdown.wait();
        tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .add_service(health)
                .serve_with_shutdown(addr, stop)
                .await;
            if let Err(e) = served {
                tracing::error!(%addr, error = %e, "liveness server failed");
            }
        });
    }
    if let Some(addr) = config.http_endpoint.0 {
        service::http::spawn(addr, registry, ready, shutdown.wait());
    }

    tracing::info!(registration = %paths.registration.display(), dra = %paths.dra.display(), "serving the kubelet");
    sockets
        .serve(registration, DraService::new(driver), shutdown.wait())
        .await?;
    tracing::info!("sockets removed; bye");
    Ok(())
}
