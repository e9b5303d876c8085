//! The kubelet plugin-registration service (`pluginregistration.Registration`).

use crate::proto::registration::registration_server::{Registration, RegistrationServer};
use crate::proto::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// `PluginInfo.type` of DRA drivers.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// Service names advertised, most preferred first: the kubelet takes the first it knows.
pub const SUPPORTED_VERSIONS: [&str; 2] = ["v1.DRAPlugin", "v1beta1.DRAPlugin"];

/// What the kubelet last said about the registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistrationState {
    /// Nothing heard yet.
    Pending,
    /// The kubelet registered the plugin.
    Registered,
    /// The kubelet refused the plugin, with its reason.
    Failed(String),
}

/// Answers `GetInfo` and records `NotifyRegistrationStatus`.
#[derive(Debug)]
pub struct RegistrationService {
    driver_name: String,
    endpoint: String,
    resource_health: bool,
    state: watch::Sender<RegistrationState>,
}

impl RegistrationService {
    /// A service advertising `driver_name` with its DRA socket at `endpoint` (absolute path).
    pub fn new(driver_name: &str, endpoint: &str) -> Self {
        Self {
            driver_name: driver_name.to_owned(),
            endpoint: endpoint.to_owned(),
            resource_health: false,
            state: watch::Sender::new(RegistrationState::Pending),
        }
    }

    /// Also advertises the health stream ([`crate::device_health::SERVICE_NAMES`]), which the
    /// kubelet then opens on the DRA socket.
    pub fn with_resource_health(mut self) -> Self {
        self.resource_health = true;
        self
    }

    /// Follows the registration state.
    pub fn state(&self) -> watch::Receiver<RegistrationState> {
        self.state.subscribe()
    }

    /// The tonic server for this service.
    pub fn into_server(self) -> RegistrationServer<Self> {
        RegistrationServer::new(self)
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.to_owned(),
            name: self.driver_name.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: SUPPORTED_VERSIONS
                .iter()
                .copied()
                .chain(
                    self.resource_health
                        .then_some(crate::device_health::SERVICE_NAMES)
                        .into_iter()
                        .flatten(),
                )
                .map(str::to_owned)
                .collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!(driver = %self.driver_name, "registered with the kubelet");
            self.state.send_replace(RegistrationState::Registered);
            Ok(Response::new(RegistrationStatusResponse {}))
        } else {
            tracing::error!(driver = %self.driver_name, error = %status.error, "the kubelet refused the registration");
            self.state
                .send_replace(RegistrationState::Failed(status.error.clone()));
            Err(Status::failed_precondition(format!(
                "plugin registration failed: {}",
                status.error
            )))
        }
    }
}
