//! The running plugin: wires configuration, NVML, the checkpoint, the sockets, the slice
//! publisher, liveness and metrics together.

use crate::cdi::CdiWriter;
use crate::checkpoint::{self, CheckpointStore, LoadOutcome};
use crate::claim_status::{StatusWriter, WithClaimStatus};
use crate::config::Config;
use crate::device_health::{HealthStream, HealthView};
use crate::devices::DeviceTable;
use crate::driver::Driver;
use crate::grpc::DraService;
use crate::liveness::HealthService;
use crate::metrics::Metrics;
use crate::mps::MpsDaemons;
use crate::mps_pods::{PodDaemons, PodSettings};
use crate::partitioner::Partitioner;
use crate::partitions::Partitioning;
use crate::prefetch::PrefetchedClaims;
use crate::publish::Publisher;
use crate::registration::{RegistrationService, RegistrationState};
use crate::server::{SocketPaths, Sockets};

mod node_events;

use anyhow::Context;
use api::contract::DRIVER_NAME;
use api::gpuclass::variants::SharedOffer;
use gpu_discovery::DriverPaths;
use gpu_discovery::{InitMode, NvmlSession, UnreadableGpu, root};
use node_agent::driver_change::{self, DriverChange, LibraryFile};
use node_agent::gpu_health::{self, Wording};
use node_agent::sockets::private_dir;
use node_events::{DraHealth, NodeEvents, report_start};
pub use node_events::{health_event, unreadable_note};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::watch;

/// Where the kernel says when this boot began (`btime`).
const PROC_STAT: &str = "/proc/stat";

/// Reads the node's devices through NVML loaded from the container driver root (their PCIe roots
/// from `sysfs_root`), with the GPUs NVML could not read (left out of the table).
pub fn read_devices(
    roots: &DriverPaths,
    sysfs_root: &Path,
) -> anyhow::Result<(DeviceTable, Vec<UnreadableGpu>)> {
    let gpus = read_gpus(roots, sysfs_root)?;
    Ok((gpus.table, gpus.unreadable))
}

/// What the plugin learns from NVML at start.
struct NodeGpus {
    table: DeviceTable,
    /// What NVML reported (the physical GPUs read, their MIG profiles).
    inventory: gpu_discovery::Inventory,
    /// The session it was read with, kept for dynamic MIG.
    session: Arc<NvmlSession>,
    unreadable: Vec<UnreadableGpu>,
    /// GPU UUIDs by NVML index, for the monitor's probes.
    by_index: BTreeMap<u32, String>,
    /// The NVML library read, which the monitor keeps reading.
    library: PathBuf,
}

fn read_gpus(roots: &DriverPaths, sysfs_root: &Path) -> anyhow::Result<NodeGpus> {
    let library = root::find_library(&roots.driver_root_ctr, "container driver root")
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let session = NvmlSession::open(&library, InitMode::Full)?;
    let mut inventory = session.inventory()?;
    gpu_discovery::pcie::fill_roots(&mut inventory, sysfs_root);
    Ok(NodeGpus {
        table: DeviceTable::from_inventory(&inventory),
        by_index: inventory
            .gpus
            .iter()
            .map(|g| (g.index, g.uuid.clone()))
            .collect(),
        unreadable: inventory.unreadable.clone(),
        inventory,
        session: Arc::new(session),
        library,
    })
}

/// After a lost checkpoint, prepares again every claim the API shows in use on this node, so
/// the exclusive-use check and unprepare know about them. Failures are logged, never fatal.
async fn rebuild(client: &kube::Client, driver: &Driver<PrefetchedClaims>, node: &str) {
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

/// Publishes the slices forever, from the moment the kubelet first registered the plugin: a slice
/// is an offer, and a claim the scheduler placed on it before the kubelet could call the plugin
/// fails its first prepare and waits for the kubelet's next pod sync (over a minute). Reading the
/// Node is retried, never fatal, so the kubelet keeps being served while the API is unreachable.
/// How long shutdown waits to withdraw a leaving node's ResourceSlices.
const WITHDRAW_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

async fn publish(
    client: kube::Client,
    node: String,
    table: Arc<DeviceTable>,
    health: watch::Receiver<HealthView>,
    offers: watch::Receiver<Vec<SharedOffer>>,
    held: watch::Receiver<std::collections::BTreeSet<String>>,
    mut registration: watch::Receiver<RegistrationState>,
) {
    if registration
        .wait_for(|s| *s == RegistrationState::Registered)
        .await
        .is_err()
    {
        return;
    }
    tracing::info!(%node, "registered with the kubelet; publishing the ResourceSlices");
    loop {
        let publisher = Publisher::new(
            client.clone(),
            DRIVER_NAME,
            &node,
            Arc::clone(&table),
            health.clone(),
            offers.clone(),
        );
        match publisher.await {
            Ok(publisher) => return publisher.with_held(held.clone()).run().await,
            Err(e) => {
                tracing::warn!(%node, error = %e, "reading this Node failed; retrying");
                tokio::time::sleep(crate::publish::RETRY).await;
            }
        }
    }
}

/// Where and how claims' MPS control daemon pods run, or why they cannot.
fn mps_pod_settings(
    config: &Config,
    roots: &DriverPaths,
    library: &Path,
) -> Result<PodSettings, String> {
    let (Some(namespace), Some(image)) = (&config.pod_namespace, &config.mps_control_daemon_image)
    else {
        return Err(format!(
            "claims asking for MPS need {} and {} (the operator sets both)",
            api::contract::env::POD_NAMESPACE,
            api::contract::env::MPS_CONTROL_DAEMON_IMAGE
        ));
    };
    Ok(PodSettings {
        namespace: namespace.clone(),
        node: config.node_name.clone(),
        image: image.clone(),
        pull_policy: config.mps_control_daemon_image_pull_policy.clone(),
        driver_root: roots.driver_root.clone(),
        binary: crate::mps_pods::find_binary(&roots.driver_root_ctr)?,
        library_dir: library
            .parent()
            .and_then(|dir| dir.strip_prefix(&roots.driver_root_ctr).ok())
            .map(Path::to_path_buf),
        mps_root: config.mps_root.clone(),
    })
}

/// Runs the plugin until SIGTERM/SIGINT.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let roots = config.node.driver_paths();
    let NodeGpus {
        table,
        inventory,
        session,
        unreadable,
        by_index,
        library,
    } = read_gpus(&roots, &config.sysfs_root).context("reading the GPUs through NVML")?;
    let partitioning = config.partitioning().map_err(anyhow::Error::msg)?;
    let table = DeviceTable {
        consumable_shares: config.consumable_shares,
        ..table
    };
    tracing::info!(devices = table.devices.len(), driver = %table.driver_version, consumable_shares = ?table.consumable_shares, "GPUs found");
    let loaded_library = LibraryFile::read(&library);
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
    let metrics = Metrics::register(&mut registry, DRIVER_NAME, &config.node_name);
    metrics.set_unreadable_gpus(unreadable.len());
    metrics.set_health(0, 0, false);
    let events = NodeEvents::new(&client, &config.node_name);
    for gpu in &unreadable {
        events
            .publish("GPUUnreadable", unreadable_note(gpu), true)
            .await;
    }
    let table = Arc::new(table);
    // Claims are read ahead from a watch of the pods bound to this node (crate::prefetch).
    let claims = PrefetchedClaims::new(client.clone());
    tokio::spawn(claims.clone().watch(config.node_name.clone()));
    let (driver, report) = Driver::start(
        DRIVER_NAME,
        &config.node_name,
        claims,
        (*table).clone(),
        CdiWriter::new(&config.node.cdi_root, &roots)
            .with_procfs_root(&config.node.procfs_root)
            .with_mps_root(&config.mps_root),
        store,
    )
    .context("loading the checkpoint")?;
    report_start(&events, &report).await;
    let (driver, table) = match partitioning {
        Partitioning::Static => (driver, table),
        Partitioning::Dynamic => {
            // The plugin's own instances, those a crash left half made (destroyed below) too.
            let mut made = driver.made_gpu_instances();
            for p in &report.unmade_partitions {
                if let Some(gi) = p.gpu_instance {
                    made.entry(p.gpu.clone()).or_default().insert(gi);
                }
            }
            let (partitioned, notes) = crate::partitions::table(&inventory, &made);
            let partitioned = DeviceTable {
                consumable_shares: table.consumable_shares,
                ..partitioned
            };
            tracing::info!(
                devices = partitioned.devices.len(),
                "dynamic MIG: GPUs offered in partitions made at prepare"
            );
            for note in notes {
                tracing::warn!(%note, "dynamic MIG");
                events.publish("MIGPartitioning", note, false).await;
            }
            let partitioner: Arc<dyn Partitioner> = Arc::new(crate::partitioner::Nvml(session));
            (
                driver
                    .with_table(partitioned.clone())
                    .with_partitioner(partitioner),
                Arc::new(partitioned),
            )
        }
    };
    // The devices prepared claims hold: the publisher keeps a share in use published.
    let (held_tx, held_rx) = watch::channel(std::collections::BTreeSet::new());
    let slicer = crate::time_slice::NvidiaSmi::find(&roots.driver_root_ctr, &library);
    let daemons: Arc<dyn MpsDaemons> = match mps_pod_settings(&config, &roots, &library) {
        Ok(settings) => Arc::new(PodDaemons::new(
            client.clone(),
            settings,
            &roots.driver_root_ctr,
        )),
        Err(why) => {
            tracing::info!(%why, "claims asking for MPS will be refused");
            Arc::new(crate::mps::Unavailable(why))
        }
    };
    let driver = Arc::new(
        driver
            .with_metrics(metrics.clone())
            .with_held_devices(held_tx)
            .with_time_slicer(Arc::new(slicer))
            .with_mps_daemons(daemons),
    );
    for (gpu, error) in driver
        .settle_time_slices(&report.unsettled_time_slices)
        .await
    {
        tracing::error!(%gpu, %error, "could not put back the time-slice interval a half-prepared claim may have set");
        let note = format!(
            "GPU {gpu} may keep the time-slice interval of a claim a crash left half-prepared: {error}"
        );
        events.publish("TimeSliceNotRestored", note, true).await;
    }
    if matches!(report.outcome, LoadOutcome::Corrupted { .. }) {
        rebuild(&client, &driver, &config.node_name).await;
    }
    for (device, error) in driver.clear_partitions(&report.unmade_partitions).await {
        tracing::error!(%device, %error, "could not destroy a MIG partition a half-prepared claim may have made");
        let note = format!(
            "MIG partition {device} of a claim a crash left half-prepared may be left on its GPU: {error}"
        );
        events.publish("MIGPartitionNotDestroyed", note, true).await;
    }
    for (claim, error) in driver.sweep_mps_daemons().await {
        tracing::error!(%claim, %error, "could not stop the MPS control daemon of a claim that is not prepared");
    }

    // Device health: the NVML monitor's thread feeds the tracker, whose view the slices and the
    // kubelet's health stream follow.
    let (view_tx, view_rx) = watch::channel(HealthView::default());
    let _health = gpu_health::follow(
        library,
        by_index,
        &config.node,
        Wording {
            unhealthy: "its devices are tainted",
            recovered: "its devices' taints are removed",
            unknown: "taints left as they are",
        },
        DraHealth {
            view: view_tx,
            recorder: events.clone(),
            table: Arc::clone(&table),
            metrics,
        },
    );
    // The GPU classes' shared offers: which GPUs are also published in shares.
    let (offers_tx, offers_rx) = watch::channel(Vec::new());
    let health_stream = HealthStream::new(Arc::clone(&table), &config.node_name, view_rx.clone())
        .with_shares(offers_rx.clone());
    tokio::spawn(crate::class_watch::follow_classes(
        client.clone(),
        offers_tx,
    ));

    // A driver changed under the plugin ends it, so that it starts again on the new one.
    let driver_changed = watch_driver(&roots, loaded_library, events.clone());
    let shutdown = service::shutdown::Shutdown::on_signal().or({
        let mut changed = driver_changed.clone();
        async move {
            if changed.wait_for(Option::is_some).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    });
    let paths = SocketPaths::new(
        &config.kubelet_registrar_directory_path,
        &config.kubelet_plugins_directory_path,
    );
    let sockets = Sockets::bind(&paths)?.with_health(health_stream);
    let registration =
        RegistrationService::new(DRIVER_NAME, &paths.dra.to_string_lossy()).with_resource_health();
    // Whether the labeler deployed this plugin on the node: only then is the label's going away
    // the node leaving DRA (crate::withdraw). Unknown counts as not.
    let deployed_at_start = match crate::withdraw::node_labels(&client, &config.node_name).await {
        Ok(labels) => crate::withdraw::deployed(&labels),
        Err(e) => {
            tracing::warn!(error = %e, "could not read this Node's labels; its ResourceSlices stay at shutdown");
            false
        }
    };
    let publishing = tokio::spawn(publish(
        client.clone(),
        config.node_name.clone(),
        Arc::clone(&table),
        view_rx.clone(),
        offers_rx,
        held_rx,
        registration.state(),
    ));
    let ready = service::http::Health::default();
    let mut registered = registration.state();
    let physical_gpus = tokio::spawn(crate::physical_gpus::follow(
        client.clone(),
        config.node_name.clone(),
        inventory.gpus,
        Arc::clone(&driver),
        (view_rx.clone(), registration.state()),
        shutdown.wait(),
    ));
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
    if let Some(addr) = config.node.http_endpoint.0 {
        service::http::spawn(addr, registry, ready, shutdown.wait());
    }

    tracing::info!(registration = %paths.registration.display(), dra = %paths.dra.display(), "serving the kubelet");
    // What prepared claims hold goes to their status.devices (crate::claim_status).
    let status_writer = StatusWriter::spawn(
        client.clone(),
        DRIVER_NAME,
        &config.node_name,
        Arc::clone(&table),
        driver.prepared_claims(),
    );
    let backend = WithClaimStatus::new(driver, status_writer);
    sockets
        .serve(
            registration,
            DraService::new(Arc::new(backend)),
            shutdown.wait(),
        )
        .await?;
    // A node leaving the DRA plane takes its slices down now, not when the kubelet gets to it
    // (crate::withdraw); nothing republishes them after this.
    publishing.abort();
    let withdrawn = tokio::time::timeout(
        WITHDRAW_TIMEOUT,
        crate::withdraw::withdraw_if_leaving(
            &client,
            &config.node_name,
            DRIVER_NAME,
            deployed_at_start,
        ),
    )
    .await;
    match withdrawn {
        Ok(Ok(0)) => {}
        Ok(Ok(deleted)) => {
            tracing::info!(
                deleted,
                "the node left the DRA plane: its ResourceSlices are deleted"
            )
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "could not withdraw the node's ResourceSlices; the kubelet removes them later")
        }
        Err(_) => {
            tracing::warn!(
                "withdrawing the node's ResourceSlices timed out; the kubelet removes them later"
            )
        }
    }
    // The PhysicalGPUs say that nothing serves them now (bounded by physical_gpu_objects::FINAL_WRITE).
    let _ = physical_gpus.await;
    if let Some(change) = driver_changed.borrow().clone() {
        anyhow::bail!("{change}: exiting, to start again on the new driver");
    }
    tracing::info!("sockets removed; bye");
    Ok(())
}

/// Watches the driver root for a driver other than the one loaded (node_agent::driver_change):
/// once one is there, tells the Node and sets the returned value.
fn watch_driver(
    roots: &DriverPaths,
    loaded: std::io::Result<LibraryFile>,
    events: NodeEvents,
) -> watch::Receiver<Option<DriverChange>> {
    let (tx, rx) = watch::channel(None);
    let loaded = match loaded {
        Ok(loaded) => loaded,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the NVML library's file; a driver changed under the plugin will go unnoticed");
            return rx;
        }
    };
    let root = roots.driver_root_ctr.clone();
    let find =
        move || root::find_library(&root, "container driver root").map_err(|e| e.to_string());
    tokio::spawn(async move {
        let change = driver_change::watch(loaded, find, driver_change::CHECK_INTERVAL).await;
        tracing::warn!(%change, "the driver changed under the plugin; restarting on the new one");
        let note = format!(
            "{change}: the kubelet plugin restarts to publish the new driver's devices and write \
             CDI specs for its files. Running pods keep the files they were given until they restart."
        );
        events.publish("GPUDriverChanged", note, true).await;
        let _ = tx.send(Some(change));
    });
    rx
}
