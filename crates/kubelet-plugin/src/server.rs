//! Binds the registration and DRA sockets and serves them until shutdown.

use crate::device_health::HealthStream;
use crate::grpc::DraService;
use crate::registration::RegistrationService;
use crate::types::DraBackend;
use node_agent::sockets::{BoundSocket, SocketError, bind_private, private_dir};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::transport::Server;

/// How long the servers may take to close their connections once shutdown begins. A kubelet that
/// keeps a connection open past it does not keep the plugin from exiting (withdrawing its slices,
/// marking its GPUs unserved) before its pod's grace period ends.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Where the two sockets go.
#[derive(Debug, Clone)]
pub struct SocketPaths {
    /// The registration socket in the kubelet's `plugins_registry`.
    pub registration: PathBuf,
    /// The DRA socket in the plugin's data directory.
    pub dra: PathBuf,
}

impl SocketPaths {
    /// The contract's paths under a registrar directory and a plugins directory.
    pub fn new(registrar_dir: &Path, plugins_dir: &Path) -> Self {
        Self {
            registration: registrar_dir.join(api::contract::paths::REGISTRATION_SOCKET),
            dra: plugins_dir.join(api::contract::paths::DRA_SOCKET),
        }
    }
}

/// Why serving stopped early.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A socket could not be bound.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// The gRPC server failed.
    #[error("gRPC server on {path}: {source}")]
    Transport {
        /// The socket.
        path: PathBuf,
        /// tonic's error.
        source: tonic::transport::Error,
    },
}

/// Bound sockets, ready to serve; the files are removed when this is dropped.
#[derive(Debug)]
pub struct Sockets {
    registration: BoundSocket,
    dra: BoundSocket,
    health: Option<HealthStream>,
}

impl Sockets {
    /// Binds both sockets: the DRA one first, so the kubelet never finds a registration socket
    /// whose endpoint is not there yet.
    pub fn bind(paths: &SocketPaths) -> Result<Self, SocketError> {
        // The DRA socket's directory is the plugin's own: make it 0700 whatever it was.
        if let Some(dir) = paths.dra.parent() {
            private_dir(dir)?;
        }
        let dra = bind_private(&paths.dra)?;
        let registration = bind_private(&paths.registration)?;
        Ok(Self {
            registration,
            dra,
            health: None,
        })
    }

    /// Also serves the kubelet's health stream on the DRA socket.
    pub fn with_health(mut self, health: HealthStream) -> Self {
        self.health = Some(health);
        self
    }

    /// Serves `registration` and both DRA versions of `dra` (and the health stream, when given)
    /// until `shutdown` resolves, then removes the sockets.
    pub async fn serve<B: DraBackend>(
        mut self,
        registration: RegistrationService,
        dra: DraService<B>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let dra_listener = self.dra.take_listener().expect("listener taken once");
        let reg_listener = self
            .registration
            .take_listener()
            .expect("listener taken once");
        let health = self.health.take().map(|h| h.stop_on(stop_rx.clone()));
        let dra_server = Server::builder()
            .add_service(dra.v1())
            .add_service(dra.v1beta1())
            .add_optional_service(health.clone().map(HealthStream::into_v1_server))
            .add_optional_service(health.map(HealthStream::into_server))
            .serve_with_incoming_shutdown(
                crate::grpc_uds::incoming(dra_listener),
                stopped(stop_rx.clone()),
            );
        let reg_server = Server::builder()
            .add_service(registration.into_server())
            .serve_with_incoming_shutdown(
                // The kubelet sends the socket path as :authority; see crate::grpc_uds.
                crate::grpc_uds::incoming(reg_listener),
                stopped(stop_rx),
            );
        let dra_path = self.dra.path().to_path_buf();
        let reg_path = self.registration.path().to_path_buf();
        let servers = async { tokio::join!(dra_server, reg_server) };
        tokio::pin!(servers);
        let (dra_result, reg_result) = tokio::select! {
            // Only a failure ends them before shutdown.
            ended = &mut servers => ended,
            () = shutdown => {
                let _ = stop_tx.send(true);
                match tokio::time::timeout(SHUTDOWN_GRACE, &mut servers).await {
                    Ok(ended) => ended,
                    Err(_) => {
                        tracing::warn!(
                            grace = ?SHUTDOWN_GRACE,
                            "the kubelet kept its connections open past the shutdown grace; closing them"
                        );
                        (Ok(()), Ok(()))
                    }
                }
            }
        };
        dra_result.map_err(|source| ServeError::Transport {
            path: dra_path,
            source,
        })?;
        reg_result.map_err(|source| ServeError::Transport {
            path: reg_path,
            source,
        })?;
        drop(self);
        Ok(())
    }
}
