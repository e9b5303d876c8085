//! One resource's socket and its registration with the kubelet, kept alive across kubelet
//! restarts.
//!
//! The plugin binds `<device-plugins dir>/<resource socket>`, serves it, and registers it through
//! the kubelet's `kubelet.sock`. A kubelet that restarts removes every plugin socket in the
//! directory; the plugin notices its socket gone (or replaced), stops that server, binds again
//! and registers again. Registration that fails (the kubelet not up yet) is retried.

use crate::grpc::{ResourceService, options};
use crate::metrics::Metrics;
use crate::proto::registration_client::RegistrationClient;
use crate::proto::{KUBELET_SOCKET, RegisterRequest, VERSION};
use crate::state::State;
use node_agent::sockets::bind_private;
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::watch;
use tonic::transport::Server;

/// How often the socket is checked for removal by a restarting kubelet.
pub const SOCKET_CHECK: Duration = Duration::from_millis(500);
/// Pause between failed registrations.
pub const REGISTER_RETRY: Duration = Duration::from_secs(2);
/// How long one registration may take before it counts as failed.
pub const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);

/// Where and what one resource serves.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// The kubelet's device-plugins directory.
    pub dir: PathBuf,
    /// The resource.
    pub resource: String,
    /// The socket's file name in `dir`.
    pub socket: String,
}

impl Endpoint {
    fn socket_path(&self) -> PathBuf {
        self.dir.join(&self.socket)
    }
}

/// Registers `endpoint` with the kubelet once, within [`REGISTER_TIMEOUT`].
pub async fn register(endpoint: &Endpoint) -> Result<(), String> {
    tokio::time::timeout(REGISTER_TIMEOUT, register_once(endpoint))
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "the kubelet did not answer within {}s",
                REGISTER_TIMEOUT.as_secs()
            ))
        })
}

async fn register_once(endpoint: &Endpoint) -> Result<(), String> {
    let kubelet = endpoint.dir.join(KUBELET_SOCKET);
    let channel = node_agent::kubelet_client::connect_unix(&kubelet)
        .await
        .map_err(|e| format!("connecting to {}: {e}", kubelet.display()))?;
    RegistrationClient::new(channel)
        .register(RegisterRequest {
            version: VERSION.to_owned(),
            endpoint: endpoint.socket.clone(),
            resource_name: endpoint.resource.clone(),
            options: Some(options()),
        })
        .await
        .map_err(|s| format!("the kubelet refused the registration: {}", s.message()))?;
    Ok(())
}

/// Serves `endpoint` until `shutdown` turns true, re-binding and re-registering whenever the
/// socket disappears. `registered` follows whether the kubelet accepted the current socket.
pub async fn run(
    endpoint: Endpoint,
    state: watch::Receiver<State>,
    metrics: Metrics,
    mut shutdown: watch::Receiver<bool>,
    registered: watch::Sender<bool>,
) {
    let path = endpoint.socket_path();
    while !*shutdown.borrow() {
        let mut bound = match bind_private(&path) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(resource = %endpoint.resource, error = %e, "binding the plugin socket failed; retrying");
                tokio::select! {
                    () = tokio::time::sleep(REGISTER_RETRY) => continue,
                    _ = shutdown.wait_for(|s| *s) => return,
                }
            }
        };
        let listener = bound.take_listener().expect("listener taken once");
        let (stop_tx, stop_rx) = watch::channel(false);
        let service = ResourceService::new(
            &endpoint.resource,
            state.clone(),
            stop_rx.clone(),
            metrics.clone(),
        );
        let mut stopped = stop_rx.clone();
        let server = tokio::spawn(
            Server::builder()
                .add_service(service.into_server())
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::UnixListenerStream::new(listener),
                    async move {
                        let _ = stopped.wait_for(|s| *s).await;
                    },
                ),
        );

        // Register, then watch the socket; both end early on shutdown or a vanished socket.
        let mut is_registered = false;
        loop {
            if !is_registered {
                let attempt = tokio::select! {
                    result = register(&endpoint) => result,
                    _ = shutdown.wait_for(|s| *s) => break,
                };
                match attempt {
                    Ok(()) => {
                        tracing::info!(resource = %endpoint.resource, socket = %path.display(), "registered with the kubelet");
                        is_registered = true;
                        let _ = registered.send(true);
                    }
                    Err(e) => {
                        tracing::warn!(resource = %endpoint.resource, error = %e, "registration failed; retrying");
                    }
                }
            }
            let pause = if is_registered {
                SOCKET_CHECK
            } else {
                REGISTER_RETRY
            };
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                _ = shutdown.wait_for(|s| *s) => break,
            }
            if !bound.is_in_place() {
                tracing::info!(resource = %endpoint.resource, "plugin socket removed (kubelet restart?); serving and registering again");
                break;
            }
        }
        let _ = registered.send(false);
        let _ = stop_tx.send(true);
        match server.await {
            Ok(Err(e)) => {
                tracing::warn!(resource = %endpoint.resource, error = %e, "gRPC server ended with an error")
            }
            Err(e) => {
                tracing::warn!(resource = %endpoint.resource, error = %e, "gRPC server task failed")
            }
            Ok(Ok(())) => {}
        }
        drop(bound);
    }
}
