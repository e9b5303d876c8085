//! The DRA plugin services, `v1` and `v1beta1`, translating between the wire messages and a
//! [`DraBackend`]. Both versions carry the same data; `v1` adds `share_id`, set for shares of a GPU.

use crate::proto::{dra_v1 as v1, dra_v1beta1 as v1beta1};
use crate::types::{ClaimRef, DraBackend, PreparedDevice};
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// Serves both DRA versions from one backend.
#[derive(Debug)]
pub struct DraService<B> {
    backend: Arc<B>,
}

impl<B> Clone for DraService<B> {
    fn clone(&self) -> Self {
        Self {
            backend: Arc::clone(&self.backend),
        }
    }
}

impl<B: DraBackend> DraService<B> {
    /// Wraps a backend.
    pub fn new(backend: Arc<B>) -> Self {
        Self { backend }
    }

    /// The `v1.DRAPlugin` server.
    pub fn v1(&self) -> v1::dra_plugin_server::DraPluginServer<Self> {
        v1::dra_plugin_server::DraPluginServer::new(self.clone())
    }

    /// The `v1beta1.DRAPlugin` server.
    pub fn v1beta1(&self) -> v1beta1::dra_plugin_server::DraPluginServer<Self> {
        v1beta1::dra_plugin_server::DraPluginServer::new(self.clone())
    }
}

/// Rejects claims missing a required field before anything else runs.
fn claim_refs<I>(claims: I) -> Result<Vec<ClaimRef>, Status>
where
    I: IntoIterator<Item = (String, String, String)>,
{
    claims
        .into_iter()
        .map(|(namespace, uid, name)| {
            if namespace.is_empty() || uid.is_empty() || name.is_empty() {
                Err(Status::invalid_argument(format!(
                    "claim {namespace:?}/{name:?} (uid {uid:?}): namespace, uid and name are required"
                )))
            } else {
                Ok(ClaimRef {
                    namespace,
                    uid,
                    name,
                })
            }
        })
        .collect()
}

macro_rules! dra_version {
    ($ver:ident $(, $share:ident)?) => {
        fn $ver(d: PreparedDevice) -> $ver::Device {
            $ver::Device {
                request_names: d.request_names,
                pool_name: d.pool,
                device_name: d.device,
                cdi_device_ids: d.cdi_device_ids,
                $($share: d.share_id,)?
            }
        }

        #[tonic::async_trait]
        impl<B: DraBackend> $ver::dra_plugin_server::DraPlugin for DraService<B> {
            async fn node_prepare_resources(
                &self,
                request: Request<$ver::NodePrepareResourcesRequest>,
            ) -> Result<Response<$ver::NodePrepareResourcesResponse>, Status> {
                let claims = claim_refs(
                    request.into_inner().claims.into_iter().map(|c| (c.namespace, c.uid, c.name)),
                )?;
                let results = self.backend.prepare(claims).await;
                let claims = results
                    .into_iter()
                    .map(|(uid, result)| {
                        let answer = match result {
                            Ok(devices) => $ver::NodePrepareResourceResponse {
                                devices: devices.into_iter().map($ver).collect(),
                                error: String::new(),
                            },
                            Err(error) => $ver::NodePrepareResourceResponse {
                                devices: Vec::new(),
                                error,
                            },
                        };
                        (uid, answer)
                    })
                    .collect();
                Ok(Response::new($ver::NodePrepareResourcesResponse { claims }))
            }

            async fn node_unprepare_resources(
                &self,
                request: Request<$ver::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<$ver::NodeUnprepareResourcesResponse>, Status> {
                let claims = claim_refs(
                    request.into_inner().claims.into_iter().map(|c| (c.namespace, c.uid, c.name)),
                )?;
                let results = self.backend.unprepare(claims).await;
                let claims = results
                    .into_iter()
                    .map(|(uid, result)| {
                        let error = result.err().unwrap_or_default();
                        (uid, $ver::NodeUnprepareResourceResponse { error })
                    })
                    .collect();
                Ok(Response::new($ver::NodeUnprepareResourcesResponse { claims }))
            }
        }
    };
}

dra_version!(v1, share_id);
dra_version!(v1beta1);
