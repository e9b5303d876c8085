//! Shared by the socket tests and the bench: a plugin `Driver` over in-memory claims and eight
//! mock A100s read through the real dlopen path, served on temp Unix sockets.
#![allow(dead_code)]

use gpu_discovery::DriverPaths;
use gpu_discovery::testing::{FakeNode, mock_config};
use gpu_discovery::{InitMode, NvmlSession, root};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kubelet_plugin::cdi::CdiWriter;
use kubelet_plugin::checkpoint::CheckpointStore;
use kubelet_plugin::devices::DeviceTable;
use kubelet_plugin::driver::{ClaimFailure, ClaimSource, Driver};
use kubelet_plugin::grpc::DraService;
use kubelet_plugin::registration::RegistrationService;
use kubelet_plugin::server::{ServeError, SocketPaths, Sockets};
use node_agent::kubelet_client::connect_unix;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// The pool (node) name used throughout.
pub const NODE: &str = "node-a";

/// Claims answered from memory, by name.
pub struct Claims(pub HashMap<String, ResourceClaim>);

impl ClaimSource for Claims {
    async fn get(&self, _: &str, name: &str) -> Result<ResourceClaim, ClaimFailure> {
        self.0.get(name).cloned().ok_or(ClaimFailure::NotFound)
    }
}

impl Claims {
    /// Indexes claims by name.
    pub fn of(claims: impl IntoIterator<Item = ResourceClaim>) -> Self {
        Self(
            claims
                .into_iter()
                .map(|c| (c.metadata.name.clone().unwrap_or_default(), c))
                .collect(),
        )
    }
}

/// A claim `ns/name` with `uid`, allocated request `gpu` on each `(pool, device)`.
pub fn claim(name: &str, uid: &str, results: &[(&str, &str)]) -> ResourceClaim {
    let results: Vec<_> = results
        .iter()
        .map(|(pool, device)| {
            serde_json::json!({"request": "gpu", "driver": "gpu.nvidia.com", "pool": pool, "device": device})
        })
        .collect();
    let status = if results.is_empty() {
        serde_json::json!({})
    } else {
        serde_json::json!({"allocation": {"devices": {"results": results}}})
    };
    serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"namespace": "ns", "name": name, "uid": uid},
        "spec": {"devices": {}}, "status": status,
    }))
    .expect("a valid claim")
}

/// Eight A100s from the mock NVML.
pub fn eight_a100s() -> DeviceTable {
    eight_a100s_on(&FakeNode::new())
}

/// Eight A100s from the mock NVML installed as `node`'s host driver (with its driver files).
pub fn eight_a100s_on(node: &FakeNode) -> DeviceTable {
    node.install_host_driver(&mock_config("a100-sxm4-40gb", 8));
    let library = root::probe(&node.settings())
        .expect("mock driver")
        .nvml_library;
    let session = NvmlSession::open(&library, InitMode::Full).expect("mock NVML opens");
    DeviceTable::from_inventory(&session.inventory().expect("inventory"))
}

/// A plugin served on temp sockets; stop it with [`Served::stop`].
pub struct Served {
    /// The temp dir holding sockets, checkpoint and CDI specs.
    pub dir: tempfile::TempDir,
    /// Where the CDI specs go.
    pub cdi_root: PathBuf,
    /// A channel to the DRA socket.
    pub channel: Channel,
    /// The fake node whose host root holds the driver the specs point at.
    pub node: FakeNode,
    stop: oneshot::Sender<()>,
    server: JoinHandle<Result<(), ServeError>>,
}

impl Served {
    /// Starts a driver for [`NODE`] over `claims` and eight mock A100s.
    pub async fn start(claims: Claims) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let node = FakeNode::new();
        let plugin_dir = dir.path().join("plugins/gpu.nvidia.com");
        std::fs::create_dir_all(&plugin_dir).unwrap();
        let cdi_root = dir.path().join("cdi");
        let (driver, _) = Driver::start(
            "gpu.nvidia.com",
            NODE,
            claims,
            eight_a100s_on(&node),
            CdiWriter::new(
                &cdi_root,
                &DriverPaths {
                    driver_root: node.host_root(),
                    driver_root_ctr: node.host_root(),
                    dev_root: node.host_root(),
                    dev_root_ctr: node.host_root(),
                },
            ),
            CheckpointStore::new(&plugin_dir, "boot"),
        )
        .expect("driver starts");
        let paths = SocketPaths::new(&dir.path().join("registry"), &dir.path().join("plugins"));
        let sockets = Sockets::bind(&paths).expect("sockets");
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(sockets.serve(
            RegistrationService::new("gpu.nvidia.com", &paths.dra.to_string_lossy()),
            DraService::new(Arc::new(driver)),
            async move {
                let _ = stopped.await;
            },
        ));
        let channel = connect_unix(&paths.dra).await.expect("connect");
        Self {
            dir,
            cdi_root,
            channel,
            node,
            stop,
            server,
        }
    }

    /// Stops serving and checks the server ended cleanly.
    pub async fn stop(self) {
        self.stop.send(()).expect("server running");
        self.server.await.expect("joined").expect("served");
    }
}
