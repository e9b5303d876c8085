//! A stand-in kubelet and a running `gpu-device-plugin` on a fake node, shared by the wire test and
//! the allocate benchmark.
#![allow(dead_code)]

use device_plugin::proto::device_plugin_client::DevicePluginClient;
use device_plugin::proto::registration_server::{Registration, RegistrationServer};
use device_plugin::proto::{Empty, RegisterRequest};
use gpu_discovery::testing::{FakeNode, install_inventory_mig_caps};
use gpu_discovery::{InitMode, NvmlSession};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// The kubelet's registration service: hands every request to the test.
pub struct Kubelet(mpsc::UnboundedSender<RegisterRequest>);

#[tonic::async_trait]
impl Registration for Kubelet {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let _ = self.0.send(request.into_inner());
        Ok(Response::new(Empty {}))
    }
}

/// Serves the kubelet's socket in `dir` until the returned sender is dropped or fired.
pub fn serve_kubelet(
    dir: &Path,
    tx: mpsc::UnboundedSender<RegisterRequest>,
) -> tokio::sync::oneshot::Sender<()> {
    let path = dir.join("kubelet.sock");
    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path).expect("bind kubelet.sock");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(Kubelet(tx)))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                async {
                    let _ = stopped.await;
                },
            ),
    );
    stop
}

/// A running plugin and the node it serves; the process is killed on drop.
pub struct Plugin {
    pub child: Child,
    pub node: FakeNode,
    pub dir: tempfile::TempDir,
    /// UUIDs of the GPUs, by NVML index.
    pub gpus: Vec<String>,
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Plugin {
    /// Starts the plugin with fast health probes (every 0.2 s, recovery after 1 s).
    pub fn start(mock: serde_json::Value, config_file: Option<&str>) -> Self {
        Self::start_with(mock, config_file, "0.2")
    }

    /// Starts the plugin probing GPU health every `probe_interval` seconds.
    pub fn start_with(
        mock: serde_json::Value,
        config_file: Option<&str>,
        probe_interval: &str,
    ) -> Self {
        let node = FakeNode::new();
        let library = node.install_host_driver(&mock);
        let session = NvmlSession::open(&library, InitMode::Full).expect("mock NVML opens");
        let inventory = session.inventory().expect("inventory");
        install_inventory_mig_caps(&node.host_root(), &inventory);
        let gpus = inventory.gpus.iter().map(|g| g.uuid.clone()).collect();
        // Short paths: Unix socket paths are limited to 107 bytes.
        let dir = tempfile::Builder::new()
            .prefix("dp")
            .tempdir_in("/tmp")
            .expect("temp dir");
        std::fs::create_dir_all(dir.path().join("device-plugins")).unwrap();
        let mut cmd = Command::new(binary());
        cmd.env_clear()
            .env("NODE_NAME", "gpu-node-0")
            .env("NVIDIA_DRIVER_ROOT", node.host_root())
            .env("DRIVER_ROOT_CTR_PATH", node.host_root())
            .env("DRIVER_READY_FILE", dir.path().join("no-driver-ready"))
            .env("PROCFS_ROOT", node.host_root())
            .env("CDI_ROOT", dir.path().join("cdi"))
            .env("DEVICE_PLUGIN_PATH", dir.path().join("device-plugins"))
            .env("HEALTH_PROBE_INTERVAL", probe_interval)
            .env("HEALTH_RECOVERY_PERIOD", "1")
            .env("RUST_LOG", "warn");
        if let Some(text) = config_file {
            let path = dir.path().join("config.yaml");
            std::fs::write(&path, text).unwrap();
            cmd.env("CONFIG_FILE", path);
        }
        let child = cmd.spawn().expect("start gpu-device-plugin");
        Self {
            child,
            node,
            dir,
            gpus,
        }
    }

    pub fn plugins_dir(&self) -> PathBuf {
        self.dir.path().join("device-plugins")
    }

    pub async fn connect(&self, socket: &str) -> DevicePluginClient<Channel> {
        let channel = node_agent::kubelet_client::connect_unix(&self.plugins_dir().join(socket))
            .await
            .expect("dial the plugin socket");
        DevicePluginClient::new(channel)
    }
}

impl Plugin {
    /// The next registration, failing at once if the plugin has exited.
    pub async fn next_registration(
        &mut self,
        rx: &mut mpsc::UnboundedReceiver<RegisterRequest>,
    ) -> RegisterRequest {
        for _ in 0..300 {
            if let Ok(Some(request)) =
                tokio::time::timeout(Duration::from_millis(100), rx.recv()).await
            {
                return request;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("gpu-device-plugin exited ({status}) before registering; its log is above");
            }
        }
        panic!("the plugin did not register within 30 s");
    }
}

/// The plugin binary cargo built for this test or bench.
fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_gpu-device-plugin")
}
