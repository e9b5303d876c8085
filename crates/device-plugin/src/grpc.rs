//! The `DevicePlugin` gRPC service of one extended resource.

use crate::allocate::{self, AllocateError};
use crate::metrics::Metrics;
use crate::proto::device_plugin_server::{DevicePlugin, DevicePluginServer};
use crate::proto::{
    AllocateRequest, AllocateResponse, ContainerPreferredAllocationResponse, DevicePluginOptions,
    Empty, ListAndWatchResponse, PreStartContainerRequest, PreStartContainerResponse,
    PreferredAllocationRequest, PreferredAllocationResponse,
};
use crate::state::State;
use std::time::Instant;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// Serves one resource from the shared [`State`]. Its `ListAndWatch` streams end when `stop`
/// turns true, so the server can shut down while the kubelet is still watching.
#[derive(Debug, Clone)]
pub struct ResourceService {
    resource: String,
    state: watch::Receiver<State>,
    stop: watch::Receiver<bool>,
    metrics: Metrics,
}

impl ResourceService {
    /// A service for `resource`.
    pub fn new(
        resource: &str,
        state: watch::Receiver<State>,
        stop: watch::Receiver<bool>,
        metrics: Metrics,
    ) -> Self {
        Self {
            resource: resource.to_owned(),
            state,
            stop,
            metrics,
        }
    }

    /// The tonic server.
    pub fn into_server(self) -> DevicePluginServer<Self> {
        DevicePluginServer::new(self)
    }

    fn current(&self) -> Result<crate::plan::Resource, Status> {
        let state = self.state.borrow();
        state
            .plan
            .resources
            .get(&self.resource)
            .cloned()
            .ok_or_else(|| {
                Status::failed_precondition(format!(
                    "{} is no longer offered on this node",
                    self.resource
                ))
            })
    }
}

#[tonic::async_trait]
impl DevicePlugin for ResourceService {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = ReceiverStream<Result<ListAndWatchResponse, Status>>;

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let mut state = self.state.clone();
        let mut stop = self.stop.clone();
        let resource = self.resource.clone();
        tokio::spawn(async move {
            let mut last = None;
            loop {
                let devices = state.borrow_and_update().devices(&resource);
                if last.as_ref() != Some(&devices) {
                    let update = ListAndWatchResponse {
                        devices: devices.clone(),
                    };
                    if tx.send(Ok(update)).await.is_err() {
                        return;
                    }
                    last = Some(devices);
                }
                let updates_ended = tokio::select! {
                    changed = state.changed() => changed.is_err(),
                    _ = stop.wait_for(|s| *s) => return,
                    () = tx.closed() => return,
                };
                if updates_ended {
                    // No more updates (the plugin is stopping): keep the stream open until the
                    // server stops or the kubelet leaves, so the devices stay listed.
                    tokio::select! {
                        _ = stop.wait_for(|s| *s) => {}
                        () = tx.closed() => {}
                    }
                    return;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let resource = self.current()?;
        let container_responses = request
            .into_inner()
            .container_requests
            .iter()
            .map(|c| ContainerPreferredAllocationResponse {
                device_i_ds: allocate::preferred(
                    &resource,
                    &c.available_device_i_ds,
                    &c.must_include_device_i_ds,
                    usize::try_from(c.allocation_size).unwrap_or(0),
                ),
            })
            .collect();
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let resource = self.current()?;
        let mut container_responses = Vec::new();
        for c in request.into_inner().container_requests {
            let started = Instant::now();
            match allocate::container(&resource, &c.devices_ids) {
                Ok(r) => {
                    self.metrics
                        .allocated(&self.resource, "ok", started.elapsed());
                    container_responses.push(r);
                }
                Err(e) => {
                    let outcome = match e {
                        AllocateError::Unknown { .. } => "unknown-device",
                        AllocateError::TooManyReplicas { .. } => "too-many-replicas",
                    };
                    self.metrics
                        .allocated(&self.resource, outcome, started.elapsed());
                    tracing::warn!(resource = %self.resource, error = %e, "allocation refused");
                    return Err(Status::invalid_argument(e.to_string()));
                }
            }
        }
        Ok(Response::new(AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

/// The options the plugin registers with: preferred allocation on, no pre-start call.
pub fn options() -> DevicePluginOptions {
    DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}
