//! The HTTP endpoint of a long-running binary: `/metrics`, `/healthz` and `/readyz`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;

/// Readiness shared between the binary's work and its `/readyz` endpoint. Liveness is the server
/// answering at all.
#[derive(Clone, Debug, Default)]
pub struct Health {
    ready: Arc<AtomicBool>,
}

impl Health {
    /// Marks the binary ready (or not) for `/readyz`.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// Whether `/readyz` answers 200.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }
}

#[derive(Clone)]
struct AppState {
    registry: Arc<Registry>,
    health: Health,
}

/// The router serving `/metrics`, `/healthz` and `/readyz`.
pub fn router(registry: Arc<Registry>, health: Health) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(AppState { registry, health })
}

/// Serves [`router`] on `addr` until `shutdown` resolves.
pub async fn serve(
    addr: SocketAddr,
    registry: Arc<Registry>,
    health: Health,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving /metrics, /healthz, /readyz");
    axum::serve(listener, router(registry, health))
        .with_graceful_shutdown(shutdown)
        .await
}

/// Serves [`router`] on `addr` in the background until `shutdown` resolves; a failure (the port is
/// taken) is logged, and the process keeps running without its metrics.
pub fn spawn(
    addr: SocketAddr,
    registry: Registry,
    health: Health,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    tokio::spawn(async move {
        if let Err(e) = serve(addr, Arc::new(registry), health, shutdown).await {
            tracing::error!(%addr, error = %e, "metrics server failed");
        }
    });
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &state.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    if state.health.is_ready() {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use prometheus_client::metrics::counter::Counter;
    use tower::ServiceExt;

    async fn get(router: &Router, path: &str) -> (StatusCode, String) {
        let response = router
            .clone()
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn readyz_follows_health_and_metrics_are_encoded() {
        let mut registry = Registry::default();
        let counter = Counter::<u64>::default();
        registry.register("reconciles", "Reconciles run", counter.clone());
        counter.inc_by(3);
        let health = Health::default();
        let router = router(Arc::new(registry), health.clone());

        assert_eq!(get(&router, "/healthz").await.0, StatusCode::OK);
        assert_eq!(
            get(&router, "/readyz").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        health.set_ready(true);
        assert_eq!(get(&router, "/readyz").await.0, StatusCode::OK);

        let (status, body) = get(&router, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("reconciles_total 3"), "{body}");
    }
}
