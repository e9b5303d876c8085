//! What every long-running binary of gpu-operator-rs needs: logging, a metrics registry served with
//! health endpoints, shutdown on SIGTERM, a kube client and Lease-based leader election.

pub mod binary;
pub mod events;
#[cfg(any(test, feature = "test-support"))]
pub mod fake_api;
pub mod http;
pub mod leader;
pub mod logging;
pub mod presence;
pub mod shutdown;

/// A kube client from the in-cluster config or `KUBECONFIG`, with `user_agent` as its User-Agent so
/// the apiserver's request metrics can tell our binaries apart.
pub async fn kube_client(user_agent: &'static str) -> Result<kube::Client, kube::Error> {
    kube::Client::try_from(config(user_agent).await?)
}

/// Like [`kube_client`], but the client never retries a request itself. kube's client retries a
/// 429 up to 15 times with a backoff that grows to minutes; for a request whose 429 is an answer
/// (an eviction a PodDisruptionBudget refuses), that holds the caller for minutes instead of
/// telling it. The caller decides when to ask again.
pub async fn kube_client_without_retries(
    user_agent: &'static str,
) -> Result<kube::Client, kube::Error> {
    let mut config = config(user_agent).await?;
    config.default_retry = false;
    kube::Client::try_from(config)
}

/// Like [`kube_client`], but speaking HTTP/2 when the API server offers it (it does, through ALPN),
/// as client-go does: concurrent requests share one connection. Over HTTP/1.1 every request sent
/// while the others are in flight opens, and TLS-handshakes, a connection of its own, which is
/// what a burst of claim reads from the kubelet plugin would pay. Falls back to [`kube_client`]
/// where the kubeconfig names a TLS server name.
pub async fn kube_client_multiplexed(
    user_agent: &'static str,
) -> Result<kube::Client, kube::Error> {
    use kube::client::ConfigExt;
    let config = config(user_agent).await?;
    if config.tls_server_name.is_some() {
        return kube::Client::try_from(config);
    }
    let mut tcp = hyper_util::client::legacy::connect::HttpConnector::new();
    tcp.enforce_http(false);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http()
        .enable_all_versions()
        .wrap_connector(tcp);
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build(https);
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(|e: hyper_util::client::legacy::Error| -> tower::BoxError { Box::new(e) })
        .service(http);
    Ok(kube::Client::new(service, config.default_namespace))
}

async fn config(user_agent: &'static str) -> Result<kube::Config, kube::Error> {
    let mut config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    config.headers.push((
        http_header::USER_AGENT,
        http_header::HeaderValue::from_static(user_agent),
    ));
    Ok(config)
}

use axum::http::header as http_header;
