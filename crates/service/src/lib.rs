//! What every long-running binary of gpu-operator-rs needs: logging, a metrics registry served with
//! health endpoints, shutdown on SIGTERM, a kube client and Lease-based leader election.

pub mod binary;
pub mod fake_api;
pub mod http;
pub mod leader;
pub mod logging;
pub mod presence;
pub mod shutdown;

/// A kube client from the in-cluster config or `KUBECONFIG`, with `user_agent` as its User-Agent so
/// the apiserver's request metrics can tell our binaries apart.
pub async fn kube_client(user_agent: &'static str) -> Result<kube::Client, kube::Error> {
    let mut config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    config.headers.push((
        http_header::USER_AGENT,
        http_header::HeaderValue::from_static(user_agent),
    ));
    kube::Client::try_from(config)
}

use axum::http::header as http_header;
