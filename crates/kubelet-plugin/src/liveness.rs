//! gRPC liveness (`grpc.health.v1.Health`) on a TCP port: `SERVING` only while the registration
//! socket answers `GetInfo` and the DRA socket answers an empty `NodePrepareResources`.

use crate::proto::dra_v1beta1::{NodePrepareResourcesRequest, dra_plugin_client::DraPluginClient};
use crate::proto::grpc_health::health_check_response::ServingStatus;
use crate::proto::grpc_health::health_server::{Health, HealthServer};
use crate::proto::grpc_health::{HealthCheckRequest, HealthCheckResponse};
use crate::proto::registration::{InfoRequest, registration_client::RegistrationClient};
use crate::server::SocketPaths;
use node_agent::kubelet_client::connect_unix;
use std::pin::Pin;
use std::time::Duration;
use tonic::{Request, Response, Status};

/// Service names answered: the whole server and `liveness`.
pub const SERVICES: [&str; 2] = ["", "liveness"];
/// Time allowed for each socket probe.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Probes the plugin's own sockets on every check.
#[derive(Debug, Clone)]
pub struct HealthService {
    paths: SocketPaths,
}

impl HealthService {
    /// Checks the sockets at `paths`.
    pub fn new(paths: SocketPaths) -> Self {
        Self { paths }
    }

    /// The tonic server.
    pub fn into_server(self) -> HealthServer<Self> {
        HealthServer::new(self)
    }

    /// Whether both sockets answer; the error says which did not.
    pub async fn probe(&self) -> Result<(), String> {
        let registration = async {
            let channel = connect_unix(&self.paths.registration)
                .await
                .map_err(|e| e.to_string())?;
            RegistrationClient::new(channel)
                .get_info(InfoRequest {})
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        };
        let dra = async {
            let channel = connect_unix(&self.paths.dra)
                .await
                .map_err(|e| e.to_string())?;
            DraPluginClient::new(channel)
                .node_prepare_resources(NodePrepareResourcesRequest { claims: vec![] })
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        };
        let timed = |what: &'static str, r: Result<Result<(), String>, _>| match r {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("{what} socket: {e}")),
            Err(_) => Err(format!("{what} socket: no answer within {PROBE_TIMEOUT:?}")),
        };
        timed(
            "registration",
            tokio::time::timeout(PROBE_TIMEOUT, registration).await,
        )?;
        timed("DRA", tokio::time::timeout(PROBE_TIMEOUT, dra).await)
    }
}

type WatchStream =
    Pin<Box<dyn futures::Stream<Item = Result<HealthCheckResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Health for HealthService {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let service = request.into_inner().service;
        if !SERVICES.contains(&service.as_str()) {
            return Err(Status::not_found(format!("unknown service {service:?}")));
        }
        let status = match self.probe().await {
            Ok(()) => ServingStatus::Serving,
            Err(e) => {
                tracing::warn!(error = %e, "liveness probe failed");
                ServingStatus::NotServing
            }
        };
        Ok(Response::new(HealthCheckResponse {
            status: status as i32,
        }))
    }

    type WatchStream = WatchStream;

    async fn watch(
        &self,
        _: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("use Check"))
    }
}
