//! Where the driver reads claims from: the API server, or a test's table.

use super::ClaimFailure;
use k8s_openapi::api::resource::v1::ResourceClaim;
use std::future::Future;

/// Where claims are read from.
pub trait ClaimSource: Send + Sync + 'static {
    /// The claim `namespace/name`, or why it could not be read.
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<ResourceClaim, ClaimFailure>> + Send;
}

/// Claims read from the API server.
#[derive(Clone)]
pub struct KubeClaims(pub kube::Client);

impl std::fmt::Debug for KubeClaims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubeClaims")
    }
}

impl ClaimSource for KubeClaims {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, ClaimFailure> {
        let api: kube::Api<ResourceClaim> = kube::Api::namespaced(self.0.clone(), namespace);
        api.get(name).await.map_err(|e| match e {
            kube::Error::Api(s) if s.is_not_found() => ClaimFailure::NotFound,
            other => ClaimFailure::Api(other.to_string()),
        })
    }
}
